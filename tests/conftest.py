"""The whole suite: which tests must share one pytest-xdist worker.

CI runs `pytest -n 3` on two cores: most integration tests wait on processes, sockets and kill
timers more than they compute, so two workers left a fifth of the CPU idle and three keep both cores
busy (docs/ci.md has the figures). The tests of
a group below run on one worker, one after another, because they share something a second worker
would duplicate or disturb:

* vllm: the session's vLLM server (a minute of start-up and gigabytes each);
* slurm: the one-node Slurm cluster, whose time-limit and queue tests count on an idle node (and
  whose session fixture holds one of its two CPUs with the time-limit job: twice would hold both);
* model-build: the default recipe's build, which runs the CPU flat out for minutes, and the tests
  that train that build (the README's commands, the deterministic runs): ROOST_HOME's; one worker
  builds it once, then they all use it, and the other worker is never left waiting on the build's lock;
* frameworks: the agent-framework suite's scripted server (tests/frameworks/conftest.py).

Groups are given to xdist by its scheduler hook, not by `xdist_group` marks: with pytest 9 the
`--dist loadgroup` marks no longer group anything (xdist 3.8 renames nodeids through an attribute
pytest no longer reads), and tests of a group then ran on both workers. Without xdist
(`pytest tests`) nothing here applies.

The units that take minutes are handed out first, longest first (SECONDS: about what CI measured), so
the run never ends with one worker on a long unit while the other has nothing left to take; the
rest follow in xdist's own order. At the end the summary says how long each worker was busy: a
suite whose workers end far apart is unbalanced, one whose workers are both busy to the end is
as fast as its tests on that many cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

# One torch thread per process. Three workers on two cores, each with torch's default of a thread per
# core, oversubscribe the CPU, and an OpenMP thread that waits for its sibling spins on a core another
# worker needs: measured on a subset of the suite (model build, fuzz, units, train CLI; `-n 3`, two
# cores), 167-174 s and 273-289 CPU-s with the default, 129-141 s and 222-243 CPU-s with one thread.
# The servers the tests start already use one (swarm/engine/precision.py: half the cores) and vLLM binds
# its own; this is for the torch work in the workers themselves and the CLIs they run. Set before any
# test module imports torch, and inherited by every process a test starts; an explicit value wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The suite runs on the embedded model's pinned CPU numerics (swarm/model/numerics.py: ATen's AVX2
# kernels, MKL's AVX2 branch), set here before anything imports torch and inherited by every process a
# test starts. So a build a test makes in process needs no pinned child (seconds of imports each), and
# the suite computes the same floats on any x86-64 host: a learning test's threshold that holds on one
# CI machine holds on the next (an AVX-512 host once built, and trained, another model).
from swarm.model.numerics import PINNED  # noqa: E402 - after OMP_NUM_THREADS; it imports no torch

for _name, _value in PINNED.items():
    os.environ.setdefault(_name, _value)

# The shared helper modules of tests/kit (procs, server_fixtures, hidden_modules, ...) import by name
# (--import-mode=importlib puts no test folder on sys.path). The suites CI runs without this conftest
# (--noconftest, or --confcutdir below it: the tinker SDK, the cookbook, the frameworks) add it themselves.
sys.path.insert(0, str(Path(__file__).resolve().parent / "kit"))

GROUPS = {
    "tests/engine_vllm/": "vllm",
    "tests/researcher/test_live_planner.py": "vllm",
    "tests/scheduler/": "slurm",
    "tests/verl/test_slurm_job.py": "slurm",
    "tests/test_model_build.py": "model-build",
    "tests/integration/test_readme_commands.py": "model-build",
    "tests/integration/test_deterministic_train.py": "model-build",  # trains the embedded model: waits for its build
    "tests/frameworks/": "frameworks",  # one scripted server per session, not one per worker
    "tests/store/": "store",  # one MLflow server per session (started early, see its conftest), not one per worker
}


# about what a unit took in CI on 2 cores (its slowest tests' --durations summed, the rest guessed):
# only the order they give matters, the longest unit first
SECONDS = {
    "vllm": 530,  # the engine's tests on shared servers (policies, LoRA, replicas), then the live planner study
    "model-build": 420,  # the default recipe's build and evaluation, the README's commands, deterministic runs
    "slurm": 200,  # 130 tests, one of them waits out a job's time limit
    "tests/chaos/test_fault_matrix.py": 160,
    "tests/chaos/test_chaos.py": 60,  # the torch engine's chaos run (the fake engine's is the soak's)
    "tests/integration/test_team_train.py": 100,  # a team killed whole, then resumed: 25-88 s of it
    "tests/chaos/test_soak.py": 65,
    # one role's server killed and restarted: at 6 steps 21 s alone and 146 s once at the end of a loaded
    # CI run (its worker finished 100 s after the others); at 4 steps 27 s alone, 34 s in CI. It still goes early
    "tests/chaos/test_team_chaos.py": 90,
    "tests/integration/test_train_cli.py": 75,
    "tests/server/test_fuzz.py": 70,  # the fake engine's server, then a torch one of two LoRA policies (its own routes)
    "tests/tinker/test_futures.py": 60,
    "tests/integration/test_train_record.py": 55,
    "tests/integration/test_train_runs.py": 55,
    "tests/researcher/test_resume.py": 55,
    "tests/integration/test_lora_train.py": 50,
    "tests/integration/test_distill_train.py": 30,
    "tests/researcher/test_shared_base.py": 30,
    "tests/chaos/test_crash_recovery.py": 26,
    "tests/researcher/test_html_report.py": 24,
    "tests/unit/test_gpu_acceptance.py": 22,
}


def group_of(nodeid: str) -> str:
    """The unit xdist hands to one worker: a group above, else the test's module.

    A module, not a single test: a module-scoped fixture (a built preset, a running server, a peft host)
    is set up once on each worker that runs one of its tests, so units of single tests paid for most such
    fixtures twice."""
    for prefix, group in GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # the client-only and verl venvs run their tests without xdist
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling  # lazy: only a run under xdist asks

    class GroupScheduling(LoadScopeScheduling):
        """Load balancing, a group at a time: every test of a group goes to the worker that took it."""

        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # once, when the queue is complete: the longest units first (a stable sort)
                units = sorted(self.workqueue.items(), key=lambda unit: -SECONDS.get(unit[0], 0))
                self.workqueue.clear()
                self.workqueue.update(units)
                self.ordered = True
            super()._assign_work_unit(node)

        def remove_node(self, node: Any) -> str | None:
            """xdist's own puts back every unit the lost worker ever took, finished ones too, at the end of
            the queue. A worker handed a finished unit is sent no test, so it never reports and is never
            handed more or shut down: once in CI the run then waited, seven tests unrun, until its
            timeout. Only the units with a test left go back, first in the queue."""
            workload = self.assigned_work.get(node, {})
            for scope in [scope for scope, unit in workload.items() if all(unit.values())]:
                del workload[scope]
            crashitem = super().remove_node(node)
            for scope, unit in workload.items():  # the test that was running when the worker died is not run again:
                if crashitem in unit:  # xdist reports it failed, and a rerun that kills the next worker (memory)
                    unit[crashitem] = True  # would only take more of the run down with it
                    if all(unit.values()):
                        self.workqueue.pop(scope, None)
            for scope in reversed(list(workload)):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            return crashitem

    return GroupScheduling(config, log)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: the verl and client-only venvs run without xdist
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """A lost worker's exit status and the machine's free memory, so a crash in CI says what ended it
    (-9: SIGKILL, as the OOM killer sends; -11: a segfault) instead of only "not properly terminated"."""
    if error is None:
        return
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)
    status: object = "unknown"
    if popen is not None:
        try:
            status = popen.wait(timeout=5)
        except Exception as exc:  # noqa: BLE001 - a diagnostic line must not fail the run
            status = f"not known ({exc})"
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    print(
        f"\nworker {node.gateway.id} lost ({error}): exit status {status}; "
        f"MemAvailable {meminfo.get('MemAvailable', '?').strip()} of {meminfo.get('MemTotal', '?').strip()}",
        flush=True,
    )
    _sweep(f"worker {node.gateway.id}'s", {"PYTEST_XDIST_WORKER": node.gateway.id, **_run_of(node)})


WORKERS: set[int] = set()  # the controller's workers' PIDs: never swept


@pytest.hookimpl(optionalhook=True)
def pytest_testnodeready(node: Any) -> None:
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)
    if popen is not None:
        WORKERS.add(popen.pid)
    RUN.update(_run_of(node))


RUN: dict[str, str] = {}  # PYTEST_XDIST_TESTRUNUID of this run, once a worker is up


def _run_of(node: Any) -> dict[str, str]:
    uid = getattr(node, "workerinput", {}).get("testrunuid")
    return {"PYTEST_XDIST_TESTRUNUID": uid} if uid else {}


def _sweep(whose: str, marks: dict[str, str]) -> None:
    """SIGKILL what a worker's tests started and left running, found by the environment xdist gives each
    worker (its id and the run's uid, which every process a test starts inherits), by PID. A worker killed
    for memory runs no teardown: its servers (and a vLLM's engine core, gigabytes) outlived it and the
    other workers ran short in turn. Named in the output, so a test that leaks is seen, not hidden."""
    if "PYTEST_XDIST_TESTRUNUID" not in marks:
        return
    from procs import marked  # lazy: tests/kit is on sys.path from above

    left = {pid: _command(pid) for pid in marked(marks, spare=WORKERS)}  # named before they go
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        named = ", ".join(f"{pid} ({cmd})" for pid, cmd in list(left.items())[:8])
        print(f"\nkilled {len(left)} process(es) {whose} tests left running: {named}", flush=True)


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "gone"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:80]


@pytest.hookimpl(trylast=True)  # after xdist's own, which shuts the workers down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller
        _sweep("the", dict(RUN))


BUSY: dict[str, float] = defaultdict(float)  # worker -> seconds its tests took (setup, call, teardown)
STARTED = time.monotonic()
LAST: dict[str, float] = {}  # worker -> when its last report came, seconds after the session began


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is not None:  # the controller of an xdist run: each report names its worker
        BUSY[worker.id] += report.duration
        LAST[worker.id] = time.monotonic() - STARTED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if BUSY:
        terminalreporter.write_line(
            "workers: " + ", ".join(f"{w} busy {BUSY[w]:.0f} s, done at {LAST[w]:.0f} s" for w in sorted(BUSY))
        )
