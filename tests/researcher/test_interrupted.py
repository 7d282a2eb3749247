"""An interrupt before `researcher study` drives its study: said, exit 130, naming what exists.

It ended the process mute (-15 for a SIGTERM) in the seconds the command imports, plans and creates its
study, and nobody could tell whether there was a study to resume."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import typer
from sqlmodel import Session, select
from typer.testing import CliRunner

from researcher.interrupted import CREATING, interrupted_line, mark, said_when_interrupted
from store.models import Study
from store.schema import init_db


def _said(stage: str | int | None) -> int:
    """The exit code of a command interrupted at `stage`, its line checked against `interrupted_line`."""
    app = typer.Typer()

    @app.command()
    @said_when_interrupted
    def study(ctx: typer.Context) -> None:
        if stage is not None:
            mark(ctx, stage)
        raise KeyboardInterrupt

    @app.command()
    def other() -> None:  # a second command: typer runs a lone one without its name
        pass

    res = CliRunner().invoke(app, ["study"])
    words = " ".join(res.output.split())
    assert " ".join(interrupted_line(stage).replace("[yellow]", "").replace("[/]", "").split()) in words
    return res.exit_code


def test_each_stage_says_what_exists_and_exits_130() -> None:
    assert _said(None) == 130 and "nothing was started" in interrupted_line(None)
    assert _said(CREATING) == 130 and "`researcher status` lists it if it was" in interrupted_line(CREATING)
    assert _said(7) == 130 and "`researcher resume 7`" in interrupted_line(7)


def test_sigterm_while_the_study_is_planned_says_nothing_was_started(tmp_path) -> None:
    """A real `researcher study` whose LLM planner waits on an endpoint that never answers (a loopback
    socket that accepts and says nothing), sent SIGTERM once its request is in: one line, exit 130, no study."""
    called = threading.Event()
    with socket.socket() as llm:
        llm.bind(("127.0.0.1", 0))
        llm.listen()
        held: list[socket.socket] = []

        def accept() -> None:
            conn, _ = llm.accept()
            held.append(conn)
            called.set()

        threading.Thread(target=accept, daemon=True).start()
        env = {
            **os.environ,
            "ROOST_LLM_BASE_URL": f"http://127.0.0.1:{llm.getsockname()[1]}/v1",
            "ROOST_LLM_MODEL": "silent",
            "ROOST_ALLOW_MODEL_REQUESTS": "1",
        }
        log = tmp_path / "researcher.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "researcher", "study", "Does lr 3e-4 beat 1e-4?", "--dry-run"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            assert called.wait(120), "the planner never called its LLM: " + log.read_text()[-2000:]
            time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 130, log.read_text()[-2000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            for conn in held:
                conn.close()
    said = " ".join(log.read_text().split())
    assert "interrupted before the study was created: nothing was started" in said, said[-2000:]
    assert "Traceback" not in said
    with Session(init_db()) as s:
        assert s.exec(select(Study)).all() == []
