"""Creating, driving, resuming and stopping studies (what the CLI and the daemon call).

    sid = create_study(StudyConfig(topic="Does the learning rate matter? Compare 0 and 3e-4"))
    drive(sid)                      # foreground: advance, sleep poll_s while trials run, repeat
    advance(sid)                    # one step: what a scheduler tick does (never blocks)

One process drives a study at a time: `advance` holds a per-study file lock
(flock, released by the kernel when a process dies, so kill -9 leaves no stale
lock); a tick that finds the lock taken simply skips.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from researcher import shared_base, tracking
from researcher.config import StudyConfig
from researcher.context import StudyContext
from researcher.graph import build_graph
from researcher.llm import make_chat_model
from researcher.llm_planner import LLMPlanner
from researcher.locks import study_lock
from researcher.report import write_report
from researcher.rules import RulesPlanner
from researcher.trials import TrialLauncher
from scheduler.manager import JobManager
from scheduler.records import StoreSink
from store.models import Study, StudyStatus, TrialStatus
from store.paths import data_dir
from store.schema import init_db

log = logging.getLogger(__name__)

RECURSION_LIMIT = 500


# ---------------------------------------------------------------- checkpointer


@contextlib.contextmanager
def checkpointer(engine: Any) -> Iterator[Any]:
    """SqliteSaver beside a SQLite store; PostgresSaver in the store's PostgreSQL database."""
    if engine.dialect.name == "postgresql":
        import psycopg  # lazy: the PostgreSQL driver and saver are optional, needed only here
        from langgraph.checkpoint.postgres import PostgresSaver  # lazy: as above
        from psycopg.rows import dict_row  # lazy: as above

        url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        pg = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver: Any = PostgresSaver(pg)  # type: ignore[arg-type]
        try:
            saver.setup()
        except BaseException:
            pg.close()
            raise
    else:
        db = engine.url.database
        base = Path(db).parent if db and db != ":memory:" else data_dir()
        path = base / "researcher-checkpoints.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        saver = SqliteSaver(conn)
    yield saver
    # Closed only after a clean exit, and under the saver's lock (its every use of the connection holds
    # it). An interrupt (Ctrl-C, SIGTERM) can leave LangGraph's thread writing the last checkpoint: a
    # connection closed under it crashed the study's driver (SIGSEGV in sqlite3, not the interrupted line
    # and `researcher resume`) and lost the write. Left open, the write ends and the connection closes
    # when that thread lets go of the saver.
    with saver.lock:
        saver.conn.close()


# ---------------------------------------------------------------- studies


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "study"


def _fresh_dir(study_dir: Path) -> Path:
    """`study_dir`, emptied of an earlier study's files by moving them aside (never deleted).

    A study's number is its row id: a store made again (roost.db deleted, a new database URL) or a
    deleted last row hands a number out again, and the new study must not write its trials over, or
    read its report from, the folder of the study that had it."""
    if study_dir.is_dir() and any(study_dir.iterdir()):
        aside = study_dir.with_name(f"{study_dir.name}.earlier-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        study_dir.rename(aside)
        log.warning("%s held an earlier study with the same number: moved to %s", study_dir, aside)
    return study_dir


def _forget_checkpoints(engine: Any, study_id: int) -> None:
    """Drop graph checkpoints left under a new study's number (its thread) by an earlier store's study.

    Without this the new study resumed the old one's graph: a finished one ended the new study at once,
    with nothing run ("Study 1 active")."""
    with checkpointer(engine) as saver:
        saver.delete_thread(str(study_id))


def create_study(
    cfg: StudyConfig,
    engine: Any = None,
    on_created: Callable[[int], None] | None = None,
    report_home: Path | None = None,
) -> int:
    """The Study row (config stored), its directory and its MLflow parent run.

    `report_home`: without `cfg.report_out`, the study's report.html is copied to
    report_home/studies/study-N (the CLI's working directory: the report lands where the user
    started the study, whoever ends it, the daemon too).

    The row and its config are one commit: a driver killed between two (SIGTERM while MLflow loads)
    left an ACTIVE study without a config that no command could read. A kill before the MLflow run
    exists is mended by the next drive (`_ensure_study_run`); `on_created` hears the id at once, so that
    an interrupt while MLflow loads can name the study it leaves."""
    engine = engine or init_db()
    with Session(engine, expire_on_commit=False) as s:
        row = Study(
            name=f"{_slug(cfg.topic)}-{os.urandom(3).hex()}",
            question=cfg.topic,
            status=StudyStatus.ACTIVE.value,
            config={},
        )
        s.add(row)
        s.flush()  # its id, for its directory, in the same transaction
        sid = row.id
        assert sid is not None
        study_dir = Path(cfg.study_dir) if cfg.study_dir else _fresh_dir(data_dir() / "studies" / f"study-{sid}")
        study_dir.mkdir(parents=True, exist_ok=True)
        update: dict[str, Any] = {"study_dir": str(study_dir)}
        if cfg.report_out is None and report_home is not None:
            update["report_out"] = str(report_home.resolve() / "studies" / f"study-{sid}")
        row.config = cfg.model_copy(update=update).model_dump(mode="json")
        s.commit()
    if on_created is not None:
        on_created(sid)
    _forget_checkpoints(engine, sid)
    with study_lock(sid, blocking=True):  # a daemon's tick of the new study makes it too: one of them does
        _ensure_study_run(engine, sid)
    return sid


def _ensure_study_run(engine: Any, study_id: int) -> None:
    """The study's MLflow parent run, started if the study has none yet: its trials are logged as its
    children and its report into it, which a study created without one skipped in silence."""
    with Session(engine, expire_on_commit=False) as s:
        row = s.get(Study, study_id)
        if row is None or row.mlflow_run_id:
            return
        cfg = StudyConfig.model_validate(row.config)
    params = {
        "topic": cfg.topic[:500],
        "planner": cfg.planner,
        "backend": cfg.backend,
        "seeds": cfg.defaults.seeds,
        "steps": cfg.defaults.steps,
    }
    run_id = tracking.start_study_run(study_id, row.name, params)
    from store.tracking import get_client  # lazy: importing MLflow takes seconds

    experiment_id = str(get_client().get_run(run_id).info.experiment_id)
    with Session(engine, expire_on_commit=False) as s:
        row = s.get(Study, study_id)
        assert row is not None
        row.mlflow_run_id, row.mlflow_experiment_id = run_id, experiment_id
        s.add(row)
        s.commit()


def load_config(engine: Any, study_id: int) -> StudyConfig:
    with Session(engine) as s:
        row = s.get(Study, study_id)
        if row is None:
            raise KeyError(f"no study {study_id}")
        return StudyConfig.model_validate(row.config)


def make_planner(cfg: StudyConfig) -> Any:
    if cfg.planner == "rules":
        return RulesPlanner(cfg.adaptive)
    model = make_chat_model({"llm_base_url": cfg.llm_base_url, "llm_model": cfg.llm_model})
    return LLMPlanner(model, token_budget=cfg.budget.llm_tokens, check_program=cfg.uses_swarm_train)


def make_context(
    study_id: int, engine: Engine | None = None, manager: JobManager | None = None, planner: Any = None
) -> StudyContext:
    engine = engine or init_db()
    cfg = load_config(engine, study_id)
    manager = manager or JobManager(StoreSink(engine=engine))
    launcher = TrialLauncher(engine, manager, cfg, study_id)
    return StudyContext(study_id, cfg, engine, planner or make_planner(cfg), launcher)


# ---------------------------------------------------------------- driving


@dataclass
class Step:
    """Where a study stands after one `advance`."""

    state: str  # done | waiting | approval | busy | inactive
    detail: dict


def _classify(snapshot: Any) -> Step:
    interrupts = list(getattr(snapshot, "interrupts", ()) or ())
    if interrupts:
        value = interrupts[0].value
        kind = value.get("kind") if isinstance(value, dict) else "wait"
        return Step("approval" if kind == "approval" else "waiting", value if isinstance(value, dict) else {})
    if _crashed_mid_graph(snapshot):
        return Step("waiting", {"next": list(snapshot.next) or [t.name for t in snapshot.tasks]})
    return Step("done", {"report": (snapshot.values or {}).get("report_path")})


def advance(
    study_id: int, *, ctx: StudyContext | None = None, resume: Any = None, on_node: Callable[[str], None] | None = None
) -> Step:
    """Run the study's graph until it next waits (trials running, approval) or ends; `on_node(name)` as
    each of its nodes starts (a planner's LLM call can take a minute: the CLI shows which)."""
    with study_lock(study_id) as got:
        if not got:
            return Step("busy", {})
        ctx = ctx or make_context(study_id)
        study = ctx.study()
        if study.status in (StudyStatus.COMPLETED.value, StudyStatus.CANCELLED.value, StudyStatus.FAILED.value):
            return Step("inactive", {"status": study.status})
        if not study.mlflow_run_id:  # its driver was killed inside create_study, before MLflow had the run
            _ensure_study_run(ctx.engine, study_id)
        with checkpointer(ctx.engine) as saver:
            graph = build_graph(ctx).compile(checkpointer=saver)
            config = {"configurable": {"thread_id": str(study_id)}, "recursion_limit": RECURSION_LIMIT}
            snap = graph.get_state(config)
            if not snap.values:
                inp: Any = {"study_id": study_id, "topic": ctx.cfg.topic}
            elif snap.interrupts:
                step = _classify(snap)
                if step.state == "approval" and resume is None:
                    return step
                if step.state == "waiting" and resume is None and _still_waiting(ctx, snap.values):
                    return step  # nothing changed: no graph step, no new checkpoint
                inp = Command(resume=resume if resume is not None else "tick")
            elif _crashed_mid_graph(snap):
                inp = None  # continue from the last checkpoint and the writes saved after it
            else:
                return _classify(snap)
            for event in graph.stream(inp, config, stream_mode="tasks"):  # as invoke runs it, events besides
                if on_node is not None and "input" in event:  # a task's start (its end has its result)
                    on_node(event["name"])
            return _classify(graph.get_state(config))


def _crashed_mid_graph(snapshot: Any) -> bool:
    """Work left that no interrupt waits on: the study's driver died inside a graph step.

    Either a node was due (`next`), or a node had finished and LangGraph had saved its writes but
    not yet the checkpoint after them (a kill -9 between the two). The snapshot then applies those
    writes and lists no `next` node, as at the graph's end, but its `tasks` still name the node
    whose writes they are; at the end there are none. Read as the end, the study stayed ACTIVE
    with no report (the resume test caught it about one run in three under load)."""
    return bool(snapshot.next or snapshot.tasks)


def _still_waiting(ctx: StudyContext, values: dict) -> bool:
    """Cheap check before resuming a waiting study: trials still running, no slot to fill.
    With early stopping the graph's monitor must look at every tick (a rung may be due)."""
    if ctx.cfg.adaptive.early_stop:
        return False
    statuses = ctx.launcher.refresh(list(values.get("trial_ids", [])))
    running = sum(1 for v in statuses.values() if v == TrialStatus.RUNNING.value)
    pending = sum(1 for v in statuses.values() if v == TrialStatus.PENDING.value)
    if not running or (pending and ctx.running_trials() < ctx.cfg.parallel):
        return False
    return ctx.over_budget(values, launching=False) is None


def drive(
    study_id: int,
    *,
    ctx: StudyContext | None = None,
    poll_s: float | None = None,
    resume: Any = None,
    on_step: Any = None,
    on_node: Callable[[str], None] | None = None,
) -> Step:
    """Advance until done or awaiting approval, sleeping between polls (the foreground tick)."""
    ctx = ctx or make_context(study_id)
    poll = poll_s if poll_s is not None else ctx.cfg.poll_s
    while True:
        step = advance(study_id, ctx=ctx, resume=resume, on_node=on_node)
        resume = None
        if on_step is not None:
            on_step(step)
        if step.state in ("done", "approval", "inactive"):
            return step
        time.sleep(poll)


class StudyEnded(ValueError):
    """A stop asked of a study that has ended: its status and report stay as they are."""


def stop_study(study_id: int, engine: Any = None, reason: str = "stopped by the user") -> Path | None:
    """Cancel the study's unfinished trials, mark it CANCELLED and write what it has.

    A COMPLETED or CANCELLED study is refused (StudyEnded): stopping it rewrote a finished study as
    cancelled, its report as "stopped early". A FAILED one (crashed) can be stopped: its trials may run."""
    ctx = make_context(study_id, engine=engine)
    with study_lock(study_id, blocking=True):
        status = ctx.study().status
        if status in (StudyStatus.COMPLETED.value, StudyStatus.CANCELLED.value):
            raise StudyEnded(f"study {study_id} has ended ({status}): nothing to stop")
        ids = [t.id for t in ctx.trials() if t.id is not None]
        ctx.launcher.cancel(ids, reason)
        if ctx.cfg.shared_base:
            shared_base.stop(ctx.launcher.manager, study_id)
        ctx.set_study_status(StudyStatus.CANCELLED)
        state: dict = {}
        with checkpointer(ctx.engine) as saver:
            graph = build_graph(ctx).compile(checkpointer=saver)
            snap = graph.get_state({"configurable": {"thread_id": str(study_id)}})
            state = dict(snap.values or {})
        state["stop_reason"] = reason
        return write_report(ctx, state)


def active_studies(engine: Any = None) -> list[int]:
    engine = engine or init_db()
    with Session(engine) as s:
        rows = s.exec(select(Study).where(Study.status == StudyStatus.ACTIVE.value)).all()
        return [r.id for r in rows if r.id is not None]
