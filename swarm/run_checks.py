"""What `swarm train` settles before it starts anything: the run's folder, and every input it can check.

A run that would fail on its inputs fails here, before a folder, a server or an MLflow run
exists: every problem found is one line naming the flag (`Problems`), all of them at once.
Checked: the model directory, the workflow (importable, callable), the dataset (given,
the task's, or a `dataset` function beside the workflow; importable, callable, and its first
tasks dicts with a `task_id`), the output folder (a folder, creatable, its earlier run, not a
`swarm serve` folder), `--resume` (something to resume, steps left, and the checkpoint it loads
of the kind the settings train: a LoRA adapter of their rank and alpha, or every weight of a model
of the same shape, as the server would check it only once started),
`--vllm-python` when given, `--device cuda` on a machine without CUDA, a `--lora-rank` wider than
a layer of the model (swarm/model/widths.py), and `--teacher`
(swarm/model/teacher.py).

The run folder follows one set of rules (the README's "The run folder" and each run.yaml's
header say the same):

* a folder holding a run is never mixed with another: `--resume` continues it, `--fresh`
  replaces it, anything else is refused with those choices; a `swarm serve` out folder is
  refused whatever the flags (neither would make it a run's);
* `swarm train --config OUT/run.yaml` (a run's own file, no `--out`) repeats that run into the
  first sibling folder holding no run, OUT-2, OUT-3, ... (said on stderr);
* a folder whose run ended before its first step (summary.json `status: failed` or
  `interrupted`, `steps_done: 0`) is replaced by the next run into it, its `logs/` kept (the
  new run's logs are appended);
* a folder whose run is still going (its driver holds `run.lock`) is refused whatever the flags:
  a `--fresh` would delete its files under it, a `--resume` start a second server on them.

The folder's files are named here (`METRICS`, `RUN_ENTRIES`); its metrics are read with
`swarm.run_layout.MetricsTail` (`swarm train` follows them, these checks count the steps done).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from store.paths import default_model_dir
from swarm.config.options import build_config, load_config_file
from swarm.config.run import RunConfig, parse_mix, sibling
from swarm.folder_lock import FolderInUse, hold_folder
from swarm.model.widths import lora_problems
from swarm.output_paths import output_problem
from swarm.resume_checks import resume_problems
from swarm.run_layout import RUN_FILE, SERVER_FILE, MetricsTail, read_metrics, role_folders, run_summary
from swarm.server.bootstrap import SERVER_LOCK
from swarm.server.recovery import BUFFER_FILE
from swarm.user_code import load

#: the server's per-step metrics, relative to the run folder (summary.json points here)
METRICS = "server/metrics.jsonl"
#: what a run writes into its folder (and `--fresh` removes; nothing else there is touched)
#: held by the `swarm train` driver running in the folder (swarm/folder_lock.py); not a run entry
RUN_LOCK = "run.lock"
#: the fleets' dataset cursors (one file per fleet; `swarm client --state`)
CURSORS = "client-state"
RUN_ENTRIES = (
    "server",
    "logs",
    "summary.json",
    RUN_FILE,
    "server.yaml",
    "servers",
    CURSORS,
)  # servers/: a --team run's
#: what a `swarm serve --out` folder holds at its top and a run folder never does (its server's are in server/)
SERVE_ENTRIES = (SERVER_FILE, SERVER_LOCK, BUFFER_FILE, "checkpoints")
#: how many tasks of a workflow's dataset are made and looked at before the run starts (the fleet makes them
#: all: a large dataset is not made twice, and a task without its `task_id` is mostly every task)
DATASET_PROBE = 16


class Problems(Exception):
    """Inputs that would make the run fail: one line each, naming the flag."""

    def __init__(self, lines: list[str], spec: RunConfig | None = None) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines
        self.spec = spec  # the settings, where they were read: the checks of a layer above can add theirs


def previous_run(out: Path) -> list[str]:
    """The traces of an earlier run in `out` (empty when there is none; `logs/` alone is what a replaced
    run left for the next one to append to, not a run)."""
    out = Path(out)
    found = [name for name in RUN_ENTRIES if (out / name).exists()]
    found += sorted(p.name for p in (*out.glob("fleet-*.yaml"), *out.glob("server-*.yaml"))) if out.is_dir() else []
    return [] if found == ["logs"] else found


def clear_run(out: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove an earlier run's files from `out`, and only those (but the entries named in `keep`)."""
    out = Path(out)
    for name in RUN_ENTRIES:
        if name in keep:
            continue
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for path in (*out.glob("fleet-*.yaml"), *out.glob("server-*.yaml")):
        path.unlink()


def steps_done(out: Path) -> int:
    """The steps the run in `out` has trained: its metrics rows; a run of several policies or servers
    (`--shared-base`, `--team`), its slowest one's, as its summary counts them."""
    return min(map(len, _metrics_rows(Path(out))), default=0)


def _metrics_rows(out: Path) -> list[list[dict]]:
    """Each trained policy's metrics rows: the run's server's, or each role's where it has several."""
    files = [out / METRICS] if (out / METRICS).is_file() else []
    files += [f / "metrics.jsonl" for f in role_folders(out) if (f / "metrics.jsonl").is_file()]
    return [read_metrics(f) for f in files]


def ended_before_training(out: Path) -> bool:
    """Whether the run in `out` failed or was interrupted before its first step (its summary says so):
    such a folder holds nothing worth keeping but its logs, and the next run into it replaces it. A step
    any of its policies or servers trained counts (a --team or --shared-base run keeps one file each,
    which went unread: such a run interrupted after its steps was replaced as one that had none)."""
    return _status(Path(out)) in ("failed", "interrupted") and not any(_metrics_rows(Path(out)))


def _load(spec: str, flag: str) -> tuple[Any, str | None]:
    """`module:attr` -> (the callable, None) or (None, the problem), imported as `swarm client` imports it."""
    obj, problem = load(spec)
    if problem is not None:
        return None, f"{flag}: {problem}"
    if not callable(obj):
        return None, f"{flag}: {spec} is not callable (it is a {type(obj).__name__})"
    return obj, None


def input_problems(spec: RunConfig) -> list[str]:
    """What would fail in the server or in every client: the model, the workflow, the dataset."""
    found: list[str] = []
    model = Path(spec.server.model_dir)
    if not (model / "config.json").exists() and model != default_model_dir():  # the default is built
        found.append(f"--model: {model} is not a Hugging Face model directory (no config.json)")
    if spec.server.wants_gpu:
        from swarm.engine.precision import device_problem  # lazy: torch, only when a GPU is asked for

        if problem := device_problem(spec.server.device):
            found.append(problem)
    found += lora_problems(spec.server)
    python = spec.server.vllm.python
    if spec.server.engine == "vllm" and python is not None and not Path(python).exists():
        found.append(f"--vllm-python: {python} does not exist")
    if spec.server.teacher:  # distillation: the teacher answers prompt logprobs in the student's tokenizer
        from swarm.model.teacher import TeacherError, check_teacher_of  # lazy: transformers takes seconds

        try:
            check_teacher_of(spec.server.teacher, model)
        except TeacherError as exc:
            found.append(str(exc))
    checks: list[tuple[str, str]] = []
    if spec.workflow is not None:
        checks.append((spec.workflow, "--workflow"))
    if spec.dataset is not None:
        checks.append((spec.dataset, "--dataset"))
    loaded: dict[str, Callable] = {}
    for text, flag in checks:
        obj, problem = _load(text, flag)
        if problem:
            found.append(problem)
        else:
            loaded[flag] = obj
    if spec.workflow is not None and spec.dataset is None and spec.task is None and "--workflow" in loaded:
        module = spec.workflow.partition(":")[0]
        beside = getattr(sys.modules.get(module), "dataset", None)
        if not callable(beside):
            found.append(
                f"--dataset: none given and {module!r} has no dataset(seed, size) function beside "
                f"{spec.workflow}: give --dataset module:function or --task NAME"
            )
        else:
            loaded["--dataset"] = beside
    if spec.task is None and "--dataset" in loaded:  # a --task's own dataset is built in
        name = spec.dataset or f"{spec.workflow.partition(':')[0]}:dataset"
        if problem := dataset_problem(loaded["--dataset"], name, spec.server.seed * 1000, spec.dataset_size):
            found.append(problem)
    return found


def dataset_problem(make: Callable, name: str, seed: int, size: int) -> str | None:
    """What is wrong with the tasks `make(seed, size)` returns (its first `DATASET_PROBE`, with the first
    fleet's seed), as every fleet thread would meet it on its first job: each died of it and the run
    waited for the fleet to end before it failed."""
    size = min(size, DATASET_PROBE)
    try:
        tasks = make(seed, size)
        first = list(tasks)[:DATASET_PROBE]
    except Exception as exc:  # noqa: BLE001 - any error of user code is the problem to report
        said = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return f"--dataset: {name}({seed}, {size}) raised {said}"
    if not first:
        return f"--dataset: {name}({seed}, {size}) returned no task"
    for i, task in enumerate(first):
        if not isinstance(task, Mapping):
            return f"--dataset: task {i} of {name} is a {type(task).__name__} (every task is a dict with a task_id)"
        if "task_id" not in task:
            return f"--dataset: task {i} of {name} has no 'task_id' (every task is a dict with a task_id)"
    return None


def out_problems(out: Path, resume: bool) -> list[str]:
    """What is wrong with `out` itself: not a folder, not creatable, a `swarm serve` folder, nothing to resume."""
    if (problem := output_problem(out, folder=True)) is not None:  # a file, or a folder it cannot make
        return [f"--out: {problem}"]
    if served := [name for name in SERVE_ENTRIES if (out / name).exists()]:
        return [
            f"--out: {out} is the out folder of a `swarm serve` ({', '.join(served)}), not a run's: a run folder "
            "is never mixed with another run; choose another --out"
        ]
    if resume and not previous_run(out):
        return [f"--resume: nothing to resume in {out}"]
    return []


def choose_out(
    requested: Path, config_file: Path | None, out_given: bool, resume: bool, fresh: bool
) -> tuple[Path, str | None, list[str]]:
    """(the folder the run goes to, a note to print, problems) by the rules in the module docstring."""
    earlier = previous_run(requested)
    if not earlier or resume:
        return requested, None, []
    own_file = config_file is not None and config_file.resolve().parent == requested.resolve()
    if own_file and not out_given:  # a repeat never clears the run it repeats, --fresh or not (it did)
        n = 2
        while previous_run(sibling(requested, n)):
            n += 1
        out = sibling(requested, n)
        kept = "; --fresh clears only a folder named with --out, never the run repeated" if fresh else ""
        return out, f"repeating the run of {requested} into {out} (--out DIR chooses the folder{kept})", []
    if fresh:
        return requested, None, []
    status = _status(requested)
    if ended_before_training(requested):
        return (
            requested,
            (
                f"replacing the {status} run in {requested} (it ended before its first step); "
                f"its logs stay in {requested / 'logs'}, appended to"
            ),
            [],
        )
    what = (
        f"an unfinished run ({status} after {steps_done(requested)} steps)"
        if status not in (None, "finished")
        else "an earlier run"
    )
    return (
        requested,
        None,
        [
            f"--out: {requested} holds {what} ({', '.join(earlier)}): pass --resume to continue "
            "it, --fresh to replace it, or choose another --out"
        ],
    )


def _status(out: Path) -> str | None:
    """summary.json's `status` of the run in `out` (None without a readable one)."""
    status = (run_summary(out) or {}).get("status")
    return status if isinstance(status, str) else None


@dataclass
class HeldRun:
    """A run folder this `swarm train` holds (`run.lock`, for the driver's life): a run still going there
    is refused in one line, not a `--fresh` that deletes its files under it or a `--resume` that starts a
    second server on them."""

    out: Path
    file: IO[str]
    made: bool  # the folder was made for this run
    lock_made: bool = False  # and its run.lock (a folder refused keeps none: a `swarm serve` folder, say)

    @classmethod
    def take(cls, out: Path) -> HeldRun:
        made, lock_made = not out.exists(), not (out / RUN_LOCK).exists()
        try:
            return cls(out, hold_folder(out, RUN_LOCK, "swarm train"), made, lock_made)
        except FolderInUse as exc:
            raise Problems(
                [
                    f"--out: {exc}, a run still going: wait for it, stop it (Ctrl-C, or kill -TERM its pid), "
                    "or choose another --out"
                ]
            ) from None

    def release(self) -> None:
        """Let go of a run refused after all (a `--team` or `--attach` check): a lock file or folder made
        for it goes too."""
        if self.lock_made:
            (self.out / RUN_LOCK).unlink(missing_ok=True)
        self.file.close()
        if self.made and not any(self.out.iterdir()):
            self.out.rmdir()


def left_running(out: Path) -> list[str]:
    """Servers and client fleets of the run in `out` still up with no driver (we hold its folder): its
    earlier `swarm train` was killed outright (SIGKILL, the OOM killer), and they, each in a session of
    its own, went on. A `--resume` would start a second server on the same folder (it is refused, deep
    in a log) and a second fleet on each cursor, a `--fresh` delete their files under them: named here
    first, one line each."""
    servers = [out / "server" / SERVER_LOCK, *sorted(out.glob(f"servers/*/{SERVER_LOCK}"))]
    fleets = sorted((out / CURSORS).glob("*.lock"))  # `swarm client`'s cursor locks (its --state + .lock)
    found = []
    for lock in [*servers, *fleets]:
        if not lock.is_file():
            continue
        try:
            hold_folder(lock.parent, lock.name, "swarm train's check").close()
        except FolderInUse as exc:
            if lock in fleets:
                what, stop = f"the client fleet on {lock.with_suffix('')} ({exc.holder})", "gives its episodes back"
            else:
                what, stop = str(exc), "checkpoints first"
            found.append(
                f"--out: {what}, left running when this run's `swarm train` was killed: stop it (kill -TERM "
                f"its pid: it {stop}), then run this again"
            )
    return found


def task_change(earlier: Any, given: Any, out: Path) -> list[str]:
    """A `--resume` that names another task than its run trained: the run went on as another one (a mix
    resumed as `--task arith` trained arith alone, its summary saying arith of every step). A team's
    resume refuses another team the same way."""
    if not given or not earlier:
        return []
    try:
        same = parse_mix(str(earlier)) == parse_mix(str(given))
    except ValueError:
        return []  # a bad --task is said by the config's own check
    if same:
        return []
    return [
        f"--task: the run in {out} trains {earlier}; resume it with that task (or without --task), "
        f"or start another run for {given}"
    ]


def prepare(
    overrides: dict[str, Any], config_file: Path | None, resume: bool, fresh: bool
) -> tuple[RunConfig, list[str], HeldRun]:
    """The run's settings, the notes to print and its folder, held (keep it while the run goes), once
    every check has passed (`Problems` otherwise); only then is an earlier run cleared
    (`--fresh`, or one that ended before its first step)."""
    file_out = load_config_file(config_file).get("out") if config_file is not None else None
    requested = Path(overrides.get("out") or file_out or RunConfig().out)
    out, note, found = choose_out(requested, config_file, "out" in overrides, resume, fresh)
    held = HeldRun.take(out) if out.is_dir() else None  # a run going there: that one line, before the others
    found += left_running(out)
    found += out_problems(out, resume)
    if resume and config_file is None and (out / RUN_FILE).exists():
        config_file = out / RUN_FILE  # the run's own settings; flags given now go on top
        if not overrides.get("team"):  # a --team start on a single run is refused as such (team_checks)
            found += task_change(load_config_file(config_file).get("task"), overrides.get("task"), out)
    spec: RunConfig = build_config(RunConfig, {**overrides, "out": out}, config_file, defaults=RunConfig())
    found += input_problems(spec)
    if resume:
        found += resume_problems(spec, out)
    if resume and not found and steps_done(out) >= spec.steps:
        done = steps_done(out)
        found.append(f"--steps: the run in {out} already has {done} step{'s' * (done != 1)}; ask for more with --steps")
    if found:
        if held is not None:
            held.release()
        raise Problems(found, spec)
    held = held or HeldRun.take(out)
    if fresh:
        clear_run(out)
    elif not resume and previous_run(out) and ended_before_training(out):
        clear_run(out, keep=("logs",))
    return spec, [note] if note else [], held


__all__ = [
    "METRICS",
    "CURSORS",
    "DATASET_PROBE",
    "HeldRun",
    "MetricsTail",
    "Problems",
    "RUN_ENTRIES",
    "RUN_FILE",
    "RUN_LOCK",
    "SERVE_ENTRIES",
    "choose_out",
    "clear_run",
    "dataset_problem",
    "ended_before_training",
    "input_problems",
    "left_running",
    "out_problems",
    "prepare",
    "previous_run",
    "read_metrics",
    "steps_done",
]
