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

from researcher.interrupted import CREATING, DRIVING, Again, Stage, interrupted_line, mark, said_when_interrupted
from store.models import Study
from store.schema import init_db


def _said(stage: Stage, command: str = "study", said: Stage = "as marked") -> int:
    """The exit code of `command` interrupted at `stage`; its line is `interrupted_line(said)` (by default
    the stage's own). `resume` and `approve` take a study id (5) and mark it first, as researcher/cli.py's do."""
    app = typer.Typer()

    def interrupt(ctx: typer.Context) -> None:
        if stage is not None:
            mark(ctx, stage)
        raise KeyboardInterrupt

    @app.command()
    @said_when_interrupted
    def study(ctx: typer.Context) -> None:
        interrupt(ctx)

    @app.command()
    @said_when_interrupted
    def resume(ctx: typer.Context, study_id: int) -> None:
        mark(ctx, Again(study_id))
        interrupt(ctx)

    @app.command()
    @said_when_interrupted
    def approve(ctx: typer.Context, study_id: int) -> None:
        mark(ctx, Again(study_id, approving=True))
        interrupt(ctx)

    res = CliRunner().invoke(app, [command] + (["5"] if command != "study" else []))
    words = " ".join(res.output.split())
    line = interrupted_line(stage if said == "as marked" else said)
    assert " ".join(line.replace("[yellow]", "").replace("[/]", "").split()) in words, words
    return res.exit_code


def test_each_stage_says_what_exists_and_exits_130() -> None:
    assert _said(None) == 130 and "nothing was started" in interrupted_line(None)
    assert _said(CREATING) == 130 and "`researcher status` lists it if it was" in interrupted_line(CREATING)
    assert _said(7) == 130 and "`researcher resume 7`" in interrupted_line(7)
    assert _said(DRIVING) == 130 and "`researcher resume ID` goes on" in interrupted_line(DRIVING)


def test_resume_and_approve_interrupted_while_loading_say_the_study_is_as_it_was() -> None:
    """Ctrl-C in the seconds `resume` and `approve` import the study machinery printed a traceback."""
    assert _said(None, "resume", said=Again(5)) == 130
    assert "`researcher resume 5` drives it" in interrupted_line(Again(5))
    assert _said(None, "approve", said=Again(5, approving=True)) == 130
    assert "study 5 still waits for approval" in interrupted_line(Again(5, approving=True))


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


def test_the_real_resume_and_approve_say_so_when_interrupted_while_they_load(monkeypatch) -> None:
    """researcher/cli.py's own commands, interrupted in their first step (checking for the research extra)."""
    from researcher import cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "require_research", interrupted)
    for args, stage in ((["resume", "5"], Again(5)), (["approve", "5"], Again(5, approving=True))):
        res = CliRunner().invoke(cli.app, args)
        line = " ".join(interrupted_line(stage).replace("[yellow]", "").replace("[/]", "").split())
        assert res.exit_code == 130 and line in " ".join(res.output.split()), res.output
