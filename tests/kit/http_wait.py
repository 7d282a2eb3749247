"""Waiting for a process the test started to answer HTTP: one client for every try.

A new `httpx.get` per try builds a client and its TLS context each time (~20 ms of CPU, plain HTTP
too), taken from the very server that is starting beside it; the product's own waits poll through
one client for the same reason (`swarm/children.py: wait_healthy`). Imported by name (tests/kit is on
sys.path); httpx is imported on use, so the venvs that run tests/kit/full_install.py need only it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_answering(
    url: str,
    proc: subprocess.Popen,
    log: Path,
    timeout: float = 90.0,
    every: float = 0.1,
    headers: dict[str, str] | None = None,
) -> None:
    """Return once GET `url` answers 200; RuntimeError with the log's tail if `proc` exits first or
    `timeout` seconds pass (the caller kills what it started)."""
    import httpx  # lazy: see the module's docstring

    end = time.monotonic() + timeout
    with httpx.Client(headers=headers or {}, timeout=2) as http:
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"{url}: the process exited with code {proc.returncode}:\n{_tail(log)}")
            try:
                if http.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(every)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else f"(no log at {log})"


__all__ = ["wait_answering"]
