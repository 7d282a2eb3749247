"""The child processes a run starts, and how it ends them.

`swarm train`, `swarm train --team`, `swarm train --attach` and the benches each start a server
and client fleets as `swarm` subprocesses over loopback. What they share lives here, so each
keeps one behaviour: a child runs in its own session (`start_new_session=True` at its `Popen`),
so `stop` ends it and whatever it started by process group, by PID, never by name; a server is
ready when its status route answers with the token, not when its port opens; a child's log is
appended to under a marker line, never truncated, so a resumed run keeps the earlier part's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import httpx

from store.ports import free_port

#: how a client fleet's line about its workflow's first failure of a kind begins (swarm/client/_fleet.py
#: prints it once per kind); `swarm train` echoes such lines from its fleets' logs (swarm/fleet_alerts.py)
WORKFLOW_FAILED = "workflow failed"
NONE_RETURNED = "workflow returned None without finishing the episode"


def swarm_command(*args: str) -> list[str]:
    """`swarm ARGS...` as this interpreter runs it (the same virtualenv, no PATH lookup)."""
    return [sys.executable, "-m", "swarm", *args]


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to a child's process group, SIGKILL after `grace` seconds; once the child has exited,
    SIGKILL to what is left of its group, since a grandchild may outlive it by a moment.

    A child that died before this call (killed, crashed; a watchdog's `poll()` reaped it) may have left
    its children behind in its group: vLLM's engine core outlived a SIGKILLed launcher, 1.5 GB a time,
    until the machine ran out of memory. Those are killed too (`sweep_group`)."""
    if proc.poll() is not None:
        sweep_group(proc.pid)
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the group is gone
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child is gone; a grandchild may still hold its group
        break
    if proc.poll() is None:
        proc.wait(timeout=5)


def sweep_group(leader: int) -> None:
    """SIGKILL what is left of the process group of a child that has exited and been reaped.

    Linux gives no new process a PID still in use as a group's ID, so while the dead leader's group
    has members, `leader` names that group and nothing else. Once the group is empty the number is
    free: if a process now holds it, the group of that ID (if any) is not the child's, and is left alone."""
    try:
        os.kill(leader, 0)
    except ProcessLookupError:
        pass  # no process has the number: a group of that ID can only be the dead child's
    except PermissionError:
        return  # the number is another user's process now
    else:
        return  # the number is a live process's now: not the child's
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGKILL)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def signals_interrupt(first: Callable[[], None] | None = None) -> Iterator[None]:
    """SIGTERM (a scheduler's cancel) and SIGHUP (the terminal closed, an ssh session dropped) act as
    Ctrl-C while inside: the run's `finally` stops its children by PID, gives back what it holds and writes
    its summary. By default both killed the driver outright, leaving its server and fleets (each in a
    session of its own) running orphaned. SIGHUP stays ignored under `nohup`; outside the main thread
    (embedded) signals are left alone.

    `first`: called (in the main thread) by each of the three, Ctrl-C too, before its interrupt is raised."""
    wanted = [signal.SIGTERM] + ([signal.SIGHUP] if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN else [])
    handler: Callable[[int, object], None] = _raise_interrupt
    if first is not None:
        wanted.append(signal.SIGINT)

        def handler(signum: int, frame: object) -> None:
            first()
            _raise_interrupt(signum, frame)

    try:
        previous = {sig: signal.signal(sig, handler) for sig in wanted}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exited(server: subprocess.Popen, log: Path) -> RuntimeError:
    return RuntimeError(f"server exited with code {server.returncode}; see {log}:\n" + log.read_text()[-2000:])


def wait_announced(server_file: Path, server: subprocess.Popen, log: Path, timeout: float = 180.0) -> str:
    """The URL a server started with port 0 bound, once it wrote `server_file` (`server.json`).

    A run's servers pick their port this way, never through `free_port`: a port found free and handed
    to the child could be taken before the child bound it (an outgoing connection's ephemeral port on a
    busy machine: a CI run's server died with "Address already in use"). The file is the server's own
    (its pid); an earlier server's, or one half written, is waited past."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise _exited(server, log)
        try:
            info = json.loads(server_file.read_text())
            if info["pid"] == server.pid:
                return str(info["url"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"the server did not say which port it bound in {timeout:.0f}s; see {log}")


def wait_serving(server_file: Path, token: str, server: subprocess.Popen, log: Path, timeout: float = 180.0) -> str:
    """The URL of a server started with port 0 (`wait_announced`), once it answers (`wait_healthy`)."""
    url = wait_announced(server_file, server, log, timeout)
    wait_healthy(url, token, server, log, timeout)
    return url


def wait_healthy(url: str, token: str, server: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    """Until the server at `url` answers its status route; its log's tail if it exits first."""
    end = time.monotonic() + timeout
    # one client for every try (20 a second): a new one per try cost ~20 ms of CPU (its TLS context),
    # ~40 % of a core taken from the server while it starts
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=2) as http:
        while time.monotonic() < end:
            if server.poll() is not None:
                raise _exited(server, log)
            try:
                if http.get(f"{url}/swarm/v1/status").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"server at {url} not healthy after {timeout:.0f}s; see {log}")


def open_log(path: Path, resume: bool, first_step: int, last_step: int) -> IO[str]:
    """A child's log, appended to under a marker line: a resumed or replaced run never loses the
    earlier part's log (the file is whole from the folder's first run on)."""
    f = path.open("a")
    f.write(
        f"--- swarm train{' --resume' if resume else ''} at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
        f"steps {first_step}..{last_step} ---\n"
    )
    f.flush()
    return f


def log_tail(log: Path, lines: int = 8) -> str:
    """The last lines of a log, indented, for an error message that names it."""
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join(f"  {line}" for line in text)


__all__ = [
    "free_port",
    "log_tail",
    "open_log",
    "signals_interrupt",
    "stop",
    "sweep_group",
    "swarm_command",
    "wait_announced",
    "wait_healthy",
    "wait_serving",
]


def quiet_progress_bars_off_terminal() -> None:
    """Off a terminal (a `swarm train` child's log, nohup, systemd, a CI log) transformers' progress bars
    ("Loading weights", "Writing model shards") are only noise: turned off unless the user set it. Read
    by huggingface_hub when transformers first imports it, so called before that."""
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
