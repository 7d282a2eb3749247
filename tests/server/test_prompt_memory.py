"""A prompt that cannot fit the model's context costs the server neither memory nor seconds.

Tokenizing a 900k-character prompt used to take seconds and ~300 MB (the embedded tokenizer
makes nearly a token per character), only to answer 400 context_length_exceeded; four at once
took a gigabyte that glibc kept. A real `swarm serve` process on loopback (the embedded
model's tokenizer and its config's context, 4,096 tokens, the fake engine), its RSS read from /proc.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.client import SwarmClient
from swarm.model.tokenizer import CONTEXT_LENGTH

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PROMPT_CHARS = 900_000
#: English with some accents, CJK and digits: the normalizer and the byte count both matter
SENTENCE = "The quick brown fox, 12 jumps over the lazy dog; naïve café ünïcode 東京. "


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def served(model_dir: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """`swarm serve` (the typer command) in its own process, killed by PID afterwards."""
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    args = [
        "--engine",
        "fake",
        "--model",
        str(model_dir),
        "--port",
        "0",
        "--out",
        str(tmp_path / "out"),
        "--token",
        "tok",
        "--admin-token",
        "adm",
        "--log-level",
        "warning",
    ]
    code = "import typer; from swarm.server.cli import serve_command; typer.run(serve_command)"
    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"on (http://\S+)", log.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("server did not start:\n" + log.read_text())
            time.sleep(0.1)
        yield proc, m.group(1)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _body(model: str, content: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8}).encode()


def _chat(url: str, key: str, body: bytes) -> tuple[int, dict[str, Any], float]:
    """(status, JSON body, seconds from sending the request to its whole answer)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=120)
    return r.status_code, r.json(), time.monotonic() - t0


def test_four_huge_prompts_cost_little_memory_and_time(served: tuple[subprocess.Popen, str]) -> None:
    """Four concurrent 900k-character prompts: each a 400 context_length_exceeded (the JSON error body)
    within 1 s, and the server's RSS rises by at most 100 MB, at its peak and after."""
    proc, url = served
    ep = SwarmClient(url, "tok").claim("t1")
    # warm: the first chat call loads the template and the routes; a long-in-characters prompt that fits
    status, body, _ = _chat(url, ep.api_key, _body(ep.model, "<|endoftext|>" * 900))  # 11.7k chars, ~905 tokens
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] > 900
    time.sleep(0.5)
    before = _rss_mb(proc.pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb(proc.pid))
            time.sleep(0.005)

    results: list[tuple[int, dict[str, Any], float]] = []
    bodies = [
        _body(ep.model, (f"{i} " + SENTENCE * (PROMPT_CHARS // len(SENTENCE) + 1))[:PROMPT_CHARS]) for i in range(4)
    ]  # made before the clock starts

    def big(i: int) -> None:
        results.append(_chat(url, ep.api_key, bodies[i]))

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=big, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.5)
    done.set()
    sampler.join()
    after = _rss_mb(proc.pid)
    assert len(results) == 4
    for status, body, seconds in results:
        assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
        assert body["error"]["type"] == "invalid_request_error"
        assert f"{CONTEXT_LENGTH}-token context" in body["error"]["message"]
        assert seconds < 1.0, [r[2] for r in results]
    assert peak[0] - before <= 100, f"RSS {before:.0f} MB -> peak {peak[0]:.0f} MB"
    assert after - before <= 100, f"RSS {before:.0f} MB -> {after:.0f} MB after"
    # still serving: an ordinary call answers
    status, body, _ = _chat(url, ep.api_key, _body(ep.model, "What is 12+30?"))
    assert status == 200, body
