"""Exactly-once launches: a crash inside a launch, and kill -9 of a running study."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from procs import hangup_default  # tests/kit, on sys.path
from sqlmodel import Session, select

from researcher.config import StudyConfig
from researcher.graph import build_graph
from researcher.planning import PlanDefaults
from researcher.runner import (
    _classify,
    _crashed_mid_graph,
    checkpointer,
    create_study,
    drive,
    make_context,
    stop_study,
)
from scheduler.manager import JobManager
from scheduler.records import StoreSink
from store.models import Job, Study, Trial
from store.schema import init_db

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"


class _Two(TypedDict, total=False):
    a: int
    b: int


class _DiesAfterFirstNode(SqliteSaver):
    """Saves like a driver killed after LangGraph stored the first node's writes and before the
    checkpoint after them: every later `put` 'kills' the process."""

    dead = False

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if self.dead and metadata.get("step", 0) >= 1:
            raise SystemExit("kill -9")
        return super().put(config, checkpoint, metadata, new_versions)


def test_a_driver_killed_between_a_nodes_writes_and_the_next_checkpoint_is_not_taken_for_the_end() -> None:
    """The state the kill -9 test below reached about one run in three under load: the snapshot lists
    no next node, as at the end, and the study stayed ACTIVE with no report."""
    saver = _DiesAfterFirstNode(sqlite3.connect(":memory:", check_same_thread=False))
    g = StateGraph(_Two)
    g.add_node("first", lambda s: {"a": 1})
    g.add_node("second", lambda s: {"b": 2})
    g.add_edge(START, "first")
    g.add_edge("first", "second")
    g.add_edge("second", END)
    graph, config = g.compile(checkpointer=saver), {"configurable": {"thread_id": "1"}}
    saver.dead = True
    with pytest.raises(SystemExit):
        graph.invoke({}, config)
    saver.dead = False
    snap = graph.get_state(config)
    assert snap.values == {"a": 1} and snap.next == ()  # the first node's writes, no next node
    assert _crashed_mid_graph(snap) and _classify(snap).state == "waiting"
    assert graph.invoke(None, config) == {"a": 1, "b": 2}  # what `advance` then does: the graph goes on
    done = graph.get_state(config)
    assert not _crashed_mid_graph(done) and _classify(done).state == "done"


def _starts(study_dir: str) -> list[int]:
    return [len(p.read_text().split()) for p in sorted(Path(study_dir).glob("trials/*/starts.log"))]


class CrashAfterSubmit(StoreSink):
    """The submitter 'dies' right after the backend started the job, before the handle is saved."""

    def update(self, job_id, **fields):
        if "external_id" in fields:
            raise SystemExit("crash between submit and record")
        return super().update(job_id, **fields)


def test_crash_between_submit_and_record_is_adopted_not_resubmitted(fake_program):
    cfg = StudyConfig(topic=TOPIC, trial_program=fake_program, defaults=PlanDefaults(steps=5), approve=True, poll_s=0.2)
    sid = create_study(cfg)
    assert drive(sid, poll_s=0.2).state == "approval"  # trials exist, nothing launched
    engine = init_db()
    with Session(engine) as s:
        tid = s.exec(select(Trial).order_by(Trial.id)).first().id
    crashing = make_context(sid, manager=JobManager(CrashAfterSubmit(engine=engine)))
    with pytest.raises(SystemExit):
        crashing.launcher.launch(tid)
    with Session(engine) as s:
        (job,) = s.exec(select(Job)).all()
        assert job.external_id is None and s.get(Trial, tid).status == "PENDING"
    ctx = make_context(sid)
    assert ctx.launcher.launch(tid) == "adopted"
    assert ctx.launcher.launch(tid) == "already"
    for _ in range(100):
        if ctx.launcher.refresh([tid])[tid] != "RUNNING":
            break
        time.sleep(0.1)
    assert ctx.launcher.refresh([tid])[tid] == "COMPLETED"
    with Session(engine) as s:
        assert len(s.exec(select(Job)).all()) == 1
    assert _starts(ctx.cfg.study_dir) == [1]
    # the rest of the study: approve, finish, and still one start per trial
    assert drive(sid, poll_s=0.2, resume={"approved": True}).state == "done"
    assert _starts(ctx.cfg.study_dir) == [1] * 6


def test_intent_without_a_job_is_submitted_once(fake_program):
    cfg = StudyConfig(topic=TOPIC, trial_program=fake_program, defaults=PlanDefaults(steps=5), approve=True)
    sid = create_study(cfg)
    drive(sid, poll_s=0.2)
    engine = init_db()

    class CrashBeforeBackend(StoreSink):
        def create(self, **kw):
            raise SystemExit("crash before the job row")

    crashing = make_context(sid, manager=JobManager(CrashBeforeBackend(engine=engine)))
    with Session(engine) as s:
        tid = s.exec(select(Trial).order_by(Trial.id)).first().id
    with pytest.raises(SystemExit):
        crashing.launcher.launch(tid)
    assert make_context(sid).launcher.launch(tid) == "submitted"


def _researcher(*args: str, env: dict) -> subprocess.Popen:
    """`researcher ARGS` in its own process group; output to a file (a pipe nobody reads fills up
    and blocks the process), appended to ROOST_HOME/researcher.log."""
    log = Path(os.environ["ROOST_HOME"]) / "researcher.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "researcher", *args],
            env={**env, "PYTHONFAULTHANDLER": "1"},  # a crash's traceback in the log (a SIGSEGV said nothing)
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=hangup_default,  # as from a terminal, also when the tests themselves run under nohup
            text=True,
        )


def _log() -> str:
    return (Path(os.environ["ROOST_HOME"]) / "researcher.log").read_text()[-3000:]


@pytest.mark.integration
def test_kill_9_mid_study_then_resume(fake_program, tmp_path):
    env = {**os.environ, "FAKE_TRIAL_SLEEP": "3", "ROOST_TRIAL_PROGRAM": " ".join(fake_program)}
    proc = _researcher("study", TOPIC, "--steps", "5", "--poll", "0.3", env=env)
    engine = init_db()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.3)
            with Session(engine) as s:
                running = [t for t in s.exec(select(Trial)).all() if t.status == "RUNNING"]
            if len(running) >= 2:
                break
        assert len(running) >= 2, "the study never launched its trials"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the researcher (its trials run in their own sessions)
        proc.wait(timeout=10)
    with Session(engine) as s:
        assert s.exec(select(Study)).one().status == "ACTIVE"
        launched_before = len(s.exec(select(Job)).all())
    assert launched_before >= 2
    res = _researcher("resume", "1", env=env)
    assert res.wait(timeout=240) == 0, _log()
    with Session(engine) as s:
        study = s.exec(select(Study)).one()
        jobs = s.exec(select(Job)).all()
        trials = s.exec(select(Trial)).all()
    # seen once under CI load (2026-11-27): `resume` exited 0 with the report written and the study
    # ACTIVE; the rows, the graph's last checkpoint and the resume's own output say where it stopped
    assert study.status == "COMPLETED", f"{_explain(engine)}\n{_graph_state(1)}"
    assert {t.status for t in trials} == {"COMPLETED"}
    assert len(jobs) == 6 and len({j.trial_id for j in jobs}) == 6  # one job per trial
    assert _starts(make_context(1).cfg.study_dir) == [1] * 6  # each trial ran once
    assert "lr=0 is worse" in study.report


@pytest.mark.integration
def test_sigterm_to_a_foreground_study_says_how_to_go_on(fake_program):
    """A foreground study sent SIGTERM (a scheduler's cancel, `kill`) or SIGHUP (its terminal closed)
    died mute; now it ends as Ctrl-C does: the line naming `researcher resume`, exit 130, trials running
    on. SIGHUP takes the same handler (`swarm.children.signals_interrupt`, tests/unit/test_children.py)."""
    env = {**os.environ, "FAKE_TRIAL_SLEEP": "30", "ROOST_TRIAL_PROGRAM": " ".join(fake_program)}
    proc = _researcher("study", TOPIC, "--steps", "5", "--poll", "0.3", env=env)
    engine = init_db()
    try:
        deadline = time.monotonic() + 120
        running: list = []
        while time.monotonic() < deadline and not running:
            time.sleep(0.3)
            with Session(engine) as s:
                running = [t for t in s.exec(select(Trial)).all() if t.status == "RUNNING"]
        assert running, "the study never launched its trials"
        proc.send_signal(signal.SIGTERM)  # the researcher alone, as `kill PID` does
        assert proc.wait(timeout=30) == 130, _log()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        assert "interrupted" in _log() and "researcher resume 1" in _log()
        with Session(engine) as s:
            assert s.exec(select(Study)).one().status == "ACTIVE"  # resumable: nothing was marked failed
        stop_study(1, engine=engine)  # the trials, in sessions of their own, are stopped by PID


def test_an_interrupt_leaves_the_checkpoint_being_written_to_end(tmp_path):
    """A SIGTERM to a foreground study killed it with SIGSEGV (CI, under load): the interrupt made
    `checkpointer` close the SQLite connection under LangGraph's thread still writing the last checkpoint
    (sqlite3 crashes on a connection closed during another thread's statement). Interrupted, it leaves the
    connection to that thread, whose write ends; a clean exit closes it under the saver's lock."""
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{tmp_path}/roost.db")
    holding, go, written = threading.Event(), threading.Event(), []

    def write(saver: Any) -> None:  # as LangGraph's thread writing a checkpoint, which an interrupt does not wait for
        with saver.cursor() as cur:  # holds the saver's lock; commits on leaving
            holding.set()
            go.wait(30)
            cur.execute("SELECT count(*) FROM checkpoints")
            count = cur.fetchone()[0]
        written.append(count)

    with pytest.raises(KeyboardInterrupt), checkpointer(engine) as saver:
        worker = threading.Thread(target=write, args=(saver,))
        worker.start()
        holding.wait(30)
        raise KeyboardInterrupt
    go.set()
    worker.join(30)
    assert written == [0]
    with checkpointer(engine) as saver:
        pass
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        saver.conn.execute("SELECT 1")


def _graph_state(study_id: int) -> str:
    """The study graph's last checkpoint: where a driver that stopped early left it."""
    ctx = make_context(study_id)
    with checkpointer(ctx.engine) as saver:
        snap = build_graph(ctx).compile(checkpointer=saver).get_state({"configurable": {"thread_id": str(study_id)}})
    v = snap.values or {}
    interrupts = [i.value for i in getattr(snap, "interrupts", ()) or ()]
    return (
        f"graph: next={snap.next} tasks={[t.name for t in snap.tasks]} interrupts={interrupts} route={v.get('route')} "
        f"stop={v.get('stop_reason')} report={v.get('report_path')} round={v.get('round')}"
    )


def _explain(engine) -> str:
    """Trial and job rows, then the log: what a failure here needs to be diagnosed from CI output."""
    with Session(engine) as s:
        rows = [f"trial {t.id}: {t.status} {t.config.get('reason', '')}" for t in s.exec(select(Trial)).all()]
        for j in s.exec(select(Job)).all():
            rows.append(f"job {j.id}: {j.state} exit={j.exit_code} {j.external_id} {j.reason or ''}")
    return "\n".join(rows) + "\n" + _log()


@pytest.mark.integration
def test_daemon_killed_mid_study_then_restarted(fake_program):
    from typer.testing import CliRunner

    from researcher.cli import app

    env = {**os.environ, "FAKE_TRIAL_SLEEP": "2"}
    res = CliRunner().invoke(
        app,
        ["study", TOPIC, "--background", "--steps", "5", "--trial-program", " ".join(fake_program)],
        env={"FAKE_TRIAL_SLEEP": "2"},
    )
    assert res.exit_code == 0, res.output
    engine = init_db()

    def trials(status: str) -> int:
        with Session(engine) as s:
            return sum(1 for t in s.exec(select(Trial)).all() if t.status == status)

    def wait_for(pred, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return True
            time.sleep(0.3)
        return False

    daemon = _researcher("-v", "daemon", "--interval", "1", env=env)
    try:
        assert wait_for(lambda: trials("RUNNING") >= 1, 120), "the daemon never launched a trial"
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)
    daemon = _researcher("-v", "daemon", "--interval", "1", env=env)
    try:
        # Wait for every trial to end (not for six COMPLETED): a failed trial then shows up at
        # once, with its reason and its job, instead of as a timeout.
        ended = wait_for(lambda: trials("COMPLETED") + trials("FAILED") + trials("CANCELLED") == 6, 240)
        assert ended and trials("COMPLETED") == 6, _explain(engine)

        def completed() -> bool:
            with Session(engine) as s:
                return s.exec(select(Study)).one().status == "COMPLETED"

        assert wait_for(completed, 60)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=30)
    with Session(engine) as s:
        jobs = s.exec(select(Job)).all()
    # one job that reached the backend per trial; a kill between a job's row and its submit leaves that row,
    # closed on the restart as never submitted (the trial then submitted once: one start each, below)
    ran = [j for j in jobs if j.external_id is not None]
    assert sorted(j.trial_id for j in ran) == [1, 2, 3, 4, 5, 6] and {j.state for j in ran} == {"COMPLETED"}
    for j in jobs:
        assert j.external_id is not None or (
            j.state == "CANCELLED" and j.reason == "submission interrupted before the backend got it"
        ), j
    assert _starts(make_context(1).cfg.study_dir) == [1] * 6
