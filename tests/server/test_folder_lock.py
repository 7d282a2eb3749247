"""One server per out folder: a second `swarm serve` on a folder in use is refused before it reads it,
and a killed server's folder is free at once (the lock dies with the process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from http_wait import wait_answering  # tests/kit, on sys.path
from procs import hangup_default  # tests/kit, on sys.path

from swarm.folder_lock import FolderInUse, describe, hold_folder


def test_a_held_folder_is_refused_naming_its_holder_and_free_once_released(tmp_path: Path) -> None:
    out = tmp_path / "out"
    held = hold_folder(out, "x.lock", "swarm serve")
    describe(held, url="http://127.0.0.1:1234")
    with pytest.raises(
        FolderInUse, match=rf"in use by another swarm serve \(pid {os.getpid()}, http://127.0.0.1:1234\)"
    ):
        hold_folder(out, "x.lock", "swarm serve")  # another open of the file: flock conflicts within one process too
    held.close()
    hold_folder(out, "x.lock", "swarm train").close()
    (out / "y.lock").write_text("not json")
    with hold_folder(out, "y.lock", "a"), pytest.raises(FolderInUse, match="in use by another process$"):
        (out / "y.lock").write_text("not json")  # a holder that has not yet said who it is
        hold_folder(out, "y.lock", "b")


def _serve(out: Path, model_dir: Path, log: Path, *more: str) -> subprocess.Popen:
    args = ["serve", "--engine", "fake", "--model", str(model_dir), "--port", "0", "--out", str(out), "--token", "t"]
    args += more
    return subprocess.Popen(
        [sys.executable, "-m", "swarm", *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=hangup_default,  # as from a terminal, also when the tests themselves run under nohup
    )


def test_a_second_server_on_a_folder_in_use_exits_in_one_line_and_a_killed_ones_folder_is_free(
    tmp_path: Path, model_dir: Path
) -> None:
    out = tmp_path / "out"
    first = _serve(out, model_dir, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 90
        while not (out / "server.json").exists():  # it holds the URL port 0 chose
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.1)
        url = json.loads((out / "server.json").read_text())["url"]
        wait_answering(f"{url}/health", first, tmp_path / "first.log")
        written = (out / "config.yaml").read_text()
        again = ["serve", "--engine", "fake", "--model", str(model_dir), "--out", str(out), "--group-size", "4"]
        second = subprocess.run(
            [sys.executable, "-m", "swarm", *again],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = [line for line in (second.stdout + second.stderr).splitlines() if line.strip()]
        assert second.returncode == 1 and len(lines) == 1, lines
        assert f"in use by another swarm serve (pid {first.pid}, {url}): stop it first" in lines[0], lines
        assert first.poll() is None and (out / "config.yaml").read_text() == written  # untouched, serving on
        os.kill(first.pid, signal.SIGKILL)  # no clean exit: the kernel frees the lock with the process
        first.wait(timeout=30)
        hold_folder(out, "server.lock", "test").close()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_hangup_stops_the_server_as_sigterm_does_with_its_last_steps_checkpointed(
    tmp_path: Path, model_dir: Path, sig: signal.Signals
) -> None:
    """The terminal a `swarm serve` runs in closes (SIGHUP): it died at once, and the steps trained since
    its last checkpoint were lost; now it stops as at SIGTERM: its step ends, its last steps are saved."""
    from swarm.client import SwarmClient

    out, log = tmp_path / "out", tmp_path / "serve.log"
    server = _serve(out, model_dir, log, "--group-size", "1", "--batch-groups", "1", "--checkpoint-every", "100")
    try:
        deadline = time.monotonic() + 90
        while not (out / "server.json").exists():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        url = json.loads((out / "server.json").read_text())["url"]
        wait_answering(f"{url}/health", server, log)
        with SwarmClient(url, "t") as client:
            for _ in range(2):
                ep = client.claim("t")
                ep.openai.chat.completions.create(model=ep.model, messages=[{"role": "user", "content": "hi"}])
                ep.finish(1.0)
            deadline = time.monotonic() + 30
            while client.status().step < 2:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        assert not (out / "checkpoints").exists() or not list((out / "checkpoints").iterdir())  # every 100 steps
        os.kill(server.pid, sig)
        server.wait(timeout=60)
        assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1:] == ["step_000002"], log.read_text()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
