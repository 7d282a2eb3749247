"""The LLM planner against a real OpenAI-compatible server: vLLM (CPU) on loopback.

The test starts `vllm.entrypoints.openai.api_server` from the vLLM virtualenv
(`.venv-vllm`, made by .ci/vllm.sh; ROOST_VLLM_PYTHON names another interpreter)
serving a model of the embedded model's architecture, and plans whole studies with
`ChatOpenAI` + JSON-schema structured output (vLLM's guided decoding makes even a
tiny model's answers schema-valid). The trials are real `swarm train` runs (in the outage study,
`--shared-base`: LoRA policies of the study's one server, each trial's job its client fleet).

Without vLLM the tests skip, saying why; with ROOST_REQUIRE_VLLM=1 (CI) they fail instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from http_wait import wait_answering  # tests/kit, on sys.path
from sqlmodel import Session, select

import researcher.llm as llm
import researcher.llm_planner as llm_planner
from researcher.config import Budget, StudyConfig, default_trial_program
from researcher.experiment import Frame
from researcher.llm import CallPolicy, make_chat_model
from researcher.llm_planner import LLMPlanner
from researcher.planning import PlanDefaults
from researcher.runner import create_study, drive, make_context
from researcher.trials import read_summary, trial_dir
from store.models import Hypothesis, Study, Trial
from store.ports import free_port
from store.schema import init_db

ROOT = Path(__file__).resolve().parents[2]
REQUIRE = os.environ.get("ROOST_REQUIRE_VLLM") == "1"
SERVED = "roost-planner"
# cheap knobs only: every trial is a real `swarm train` run on CPU
KNOBS = ["lr", "kl_coef", "advantage", "loss_agg", "normalize_std"]

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def vllm_python() -> Path:
    env = os.environ.get("ROOST_VLLM_PYTHON")
    return Path(env) if env else ROOT / os.environ.get("ROOST_VLLM_VENV", ".venv-vllm") / "bin" / "python"


@cache
def why_no_vllm() -> str | None:
    py = vllm_python()
    if not py.exists():
        return f"no vLLM interpreter at {py} (run .ci/vllm.sh, or set ROOST_VLLM_PYTHON)"
    r = subprocess.run([str(py), "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    return None if r.returncode == 0 else f"`import vllm` fails in {py}: {r.stderr.strip()[-300:]}"


class VLLMServer:
    """A vLLM OpenAI server this test started (own process group; killed by its id)."""

    def __init__(self, model: Path, log: Path) -> None:
        self.model, self.log = model, log
        self.port = free_port()  # kept across the test's restarts of it; below the ephemeral range
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 420.0) -> None:
        # the engine's worker runs inside its engine core process (`uni`; on CPU only with V1 multiprocessing
        # off): two processes importing vLLM instead of three, ~14 s less per start on 2 loaded cores
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        }  # planner prompts run past the model's 1024 positions
        argv = [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            SERVED,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "16384",
            "--enforce-eager",
            "--distributed-executor-backend",
            "uni",
        ]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_answering(f"http://127.0.0.1:{self.port}/health", self.proc, self.log, timeout, every=1.0)
        except RuntimeError:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the server's process group (its engine core too), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    reason = why_no_vllm()
    if reason:
        if REQUIRE:
            pytest.fail(f"ROOST_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
    from swarm.testing import tiny_model_dir  # lazy: builds with torch and transformers

    base = tmp_path_factory.mktemp("live-planner")
    server = VLLMServer(tiny_model_dir(base), base / "vllm.log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def live(vllm_server: VLLMServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[VLLMServer]:
    """Real model requests allowed (the researcher's conftest forbids them), for this test only."""
    monkeypatch.setenv(llm.ENV_ALLOW, "1")
    with llm.model_requests_allowed(True):
        yield vllm_server


def _study(server: VLLMServer, topic: str, parallel: int = 2, shared_base: bool = False, **budget: int) -> StudyConfig:
    return StudyConfig(
        topic=topic,
        shared_base=shared_base,
        planner="llm",
        llm_base_url=server.url,
        llm_model=SERVED,
        poll_s=1.0,
        parallel=parallel,
        defaults=PlanDefaults(steps=2, seeds=3, max_arms=2),
        budget=Budget(**budget),
        model_dir=str(server.model),  # the served model: trials never build the embedded one (minutes)
        # tiny batches: real `swarm train` runs that finish in seconds on CPU; without MLflow (nothing here
        # checks it: the researcher reads summary.json and logs each trial's MLflow run itself)
        trial_program=[*default_trial_program(), "--no-mlflow", "--group-size", "2", "--batch-groups", "2"],
    )


def test_the_live_studys_trials_run_the_served_model() -> None:
    """The trial program is `python -m swarm train` with flags of its own: still `swarm train`, so each
    trial gets `--model` (the served model) instead of building the embedded one (minutes on 2 cores)."""
    server = cast(VLLMServer, SimpleNamespace(url="http://127.0.0.1:1/v1", model=Path("/served/model")))
    cfg = _study(server, "Does lr matter?")
    assert cfg.uses_swarm_train and cfg.model_dir == "/served/model"


def _planner(server: VLLMServer, max_tokens: int = 2048, **kw: object) -> LLMPlanner:
    model = make_chat_model(
        {"llm_base_url": server.url, "llm_model": SERVED}, timeout_s=300, temperature=1.0, max_tokens=max_tokens
    )
    return LLMPlanner(model, knobs=KNOBS, check_program=False, **kw)  # type: ignore[arg-type]


def _all_done(sid: int) -> bool:
    with Session(init_db()) as s:
        trials = s.exec(select(Trial).where(Trial.study_id == sid)).all()
    return bool(trials) and all(t.status in ("COMPLETED", "FAILED", "CANCELLED") for t in trials)


@pytest.mark.timeout(1800)
def test_a_study_planned_by_vllm_survives_the_server_dying(live: VLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """frame → hypothesize → design → launch → analyse → decide → report, every plan from vLLM.

    The server is killed once the first trials run and restarted only after they all
    finished, so the planner's next call (decide) meets a dead endpoint: it waits with
    backoff, the restarted server answers, and the study goes on without re-launching
    anything.
    """
    # all of a round's trials at once (2 arms x 3 seeds) as LoRA policies of the study's one server (its own
    # job: 7 in all): a trial's job is its client fleet only, so six trials cost one server's start-up, not
    # six (~35 CPU-s less on 2 cores); the planner's knobs (KNOBS) are all ones a policy can set
    monkeypatch.setenv("ROOST_LOCAL_MAX_JOBS", "7")
    cfg = _study(
        live,
        "Does the learning rate matter on arith? Compare lr 0 with lr 3e-4.",
        parallel=6,
        shared_base=True,
        max_trials=9,
        llm_tokens=400_000,
    )
    sid = create_study(cfg)
    # one round: `decide` still asks the (dead, then restarted) server, as the trial budget has room, but going
    # on asks it for no new hypothesis and design (~20 s) that the 3 trials left could not run anyway, and
    # `decide` itself is asked with no room for follow-ups (the longest part of an untrained model's answer)
    # backoff up to 2 s: the restarted server answers within 2 s of being up, not up to 10 s later (what
    # is checked is that `decide` waits out the dead endpoint, not how long its backoff grows)
    planner = _planner(live, policy=CallPolicy(wait_s=600, backoff_s=1, backoff_max_s=2), max_rounds=1)
    ctx = make_context(sid, planner=planner)
    events: list[str] = []
    restarter: list[threading.Thread] = []

    def restart_when_trials_are_done() -> None:  # meanwhile `decide` is blocked in its backoff
        while not _all_done(sid):
            time.sleep(1)
        events.append("restarting")
        live.start()

    def on_step(step: object) -> None:
        if getattr(step, "state", "") == "waiting" and "killed" not in events:
            live.kill()
            events.append("killed")
            restarter.append(threading.Thread(target=restart_when_trials_are_done, daemon=True))
            restarter[0].start()

    step = drive(sid, ctx=ctx, poll_s=1.0, on_step=on_step)
    if restarter:
        restarter[0].join(600)
    if live.proc is None:  # the study ended before it needed the server again: bring it back for others
        live.start()
    assert step.state == "done", step
    with Session(init_db()) as s:
        study = s.get(Study, sid)
        trials = s.exec(select(Trial).where(Trial.study_id == sid)).all()
        hyps = s.exec(select(Hypothesis).where(Hypothesis.study_id == sid)).all()
    assert study is not None and study.status == "COMPLETED" and study.report
    print(
        f"\n--- live study {sid}: {len(trials)} trials, {planner.tokens_used} LLM tokens, "
        f"{planner.policy.transport_retries} transport retries ---\n{study.report}"
    )
    assert "killed" in events and "restarting" in events
    assert planner.policy.transport_retries > 0  # decide met the dead server and waited
    keys = [(t.hypothesis_id, t.arm, t.seed) for t in trials]
    assert len(keys) == len(set(keys)) >= 6  # no duplicate trials after the outage
    assert {t.status for t in trials} == {"COMPLETED"}, [(t.arm, t.status) for t in trials]
    trained = {(read_summary(trial_dir(ctx.cfg, t.id) / "out") or {}).get("model") for t in trials}  # type: ignore[arg-type]
    assert trained == {str(live.model)}, trained  # the study's model_dir, not a freshly built embedded model
    assert len(hyps) == 1 and hyps[0].statement  # no follow-up: 3 trials left cannot run one
    state = drive(sid, ctx=ctx, poll_s=1.0)  # a finished study stays finished
    assert state.state in ("done", "inactive")
    assert planner.tokens_used > 1000  # from vLLM's usage: prompts alone are thousands of tokens


def test_answers_failing_validation_end_the_study_with_a_clear_error(
    live: VLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server is asked for the loose pydantic schema (any strings as knob names), so a
    tiny model's frames fail validation until the retries run out: the study ends with
    the reason in its report, and no hypothesis or trial was written."""
    monkeypatch.setattr(llm_planner, "frame_schema", lambda knobs: Frame.model_json_schema())
    cfg = _study(live, "Does the learning rate matter on arith?", max_trials=6)
    sid = create_study(cfg)
    planner = _planner(live, max_tokens=128, retries=2)  # rambling answers are cut off: invalid too
    step = drive(sid, ctx=make_context(sid, planner=planner), poll_s=0.5)
    assert step.state == "done"
    with Session(init_db()) as s:
        study = s.get(Study, sid)
        trials = s.exec(select(Trial).where(Trial.study_id == sid)).all()
        hyps = s.exec(select(Hypothesis).where(Hypothesis.study_id == sid)).all()
    assert study is not None and study.report and study.status == "COMPLETED"
    assert "the llm planner gave no valid answer: no valid Frame after 3 attempts" in " ".join(study.report.split())
    assert trials == [] and hyps == []
    assert planner.tokens_used > 0
