"""Slurm backend: batch scripts, `sbatch --parsable`, batched polling, `scancel`, `find`.

    backend = SlurmBackend()                       # or SlurmBackend(runner=FakeSlurm()) in tests
    h = backend.submit(JobSpec(name="x", command=["python", "train.py"], time_limit_s=600))
    backend.status([h])                            # {'123': JobStatus(state=RUNNING, ...)}

Polling: one `squeue --json` answers for every job (Slurm 22.05 ignores filters with
--json, so one call is all jobs anyway). Jobs missing from it are asked with
`scontrol show job -o ID`, then `sacct --json` where accounting is configured, and
finally the exit-code file the batch script writes, so a job's result is known even
after slurmctld forgot it (MinJobAge) on a cluster without an accounting database.
Repeated polls back off like submitit's (2, 4, 8 s … up to a minute while nothing
changes; reset by any change, submit or cancel) and return cached states in between.

pyslurm is used instead of the command line only where it imports and its version
matches the cluster's (pyslurm X.Y needs Slurm X.Y; it is not installable here, so that
branch is thin and untested). Parsing is pure and lives in `scheduler._slurm_parse`.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler._slurm_parse import (
    map_state,
    parse_sacct_json,
    parse_scontrol_line,
    parse_squeue_json,
    status_from_exit_file,
    ts,
)
from scheduler.base import BackendError, BackendUnavailable, JobHandle, JobStatus, Stream, read_log
from scheduler.spec import ENV_JOB_ID, JobSpec
from store.models import JobState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], CommandResult]


def subprocess_runner(argv: Sequence[str], timeout: float = 60.0) -> CommandResult:
    """Run a Slurm command; a missing binary or a hang becomes a non-zero result."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        return CommandResult(127, "", str(e))
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"{argv[0]} timed out after {timeout:g} s")
    return CommandResult(p.returncode, p.stdout, p.stderr)


# ---------------------------------------------------------------- rendering (pure)


def format_time_limit(seconds: int) -> str:
    """Slurm's D-HH:MM:SS, rounded *up* to whole minutes (Slurm's granularity)."""
    minutes = max(1, math.ceil(seconds / 60))
    d, rem = divmod(minutes, 24 * 60)
    h, m = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:00"


def log_paths(spec: JobSpec, job_id: str = "%j") -> tuple[Path, Path, Path]:
    """stdout, stderr and exit-code file of a job (`%j` before the id is known)."""
    base = spec.resolved_log_dir() / f"{spec.name}-{job_id}"
    return base.with_suffix(".out"), base.with_suffix(".err"), base.with_suffix(".exit")


def render_script(spec: JobSpec) -> str:
    """The batch script for `spec`. Every resource is explicit, `--time` always."""
    out, err, _ = log_paths(spec)
    for p in (out, err):
        if any(c.isspace() for c in str(p)):
            raise BackendError(f"Slurm log paths may not contain whitespace: {p}")
    opts = [
        f"--job-name={spec.name}",
        f"--time={format_time_limit(spec.time_limit_s)}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.cpus}",
    ]
    if spec.mem_mb is not None:
        opts.append(f"--mem={spec.mem_mb}M")
    if spec.gpus:
        opts.append(f"--gpus-per-node={spec.gpus}")
    if spec.partition:
        opts.append(f"--partition={spec.partition}")
    if spec.cwd:
        opts.append(f"--chdir={spec.cwd}")
    opts += [f"--output={out}", f"--error={err}", "--open-mode=append", "--export=ALL"]
    exit_file = str(log_paths(spec, "${SLURM_JOB_ID}")[2])
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in opts),
        "#",
        f"# Rendered by scheduler.slurm for Roost job {spec.name!r}. The exit code is also",
        "# written to a file so it is known after Slurm forgets the job.",
        "",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())]
    if spec.setup:
        lines += ["set -e", *spec.setup, "set +e"]
    lines += [shlex.join(spec.command), "rc=$?", f'echo "$rc" > "{exit_file}"', 'exit "$rc"', ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- backend


class SlurmBackend:
    """Jobs as Slurm batch jobs, through the command-line tools (or pyslurm where it fits)."""

    name = "slurm"

    def __init__(
        self,
        runner: Runner | None = None,
        min_poll_s: float = 2.0,
        max_poll_s: float = 60.0,
        use_pyslurm: bool | None = None,
    ) -> None:
        self.run = runner or subprocess_runner
        self.min_poll_s = min_poll_s
        self.max_poll_s = max_poll_s
        self._interval = 0.0
        self._next_poll = 0.0
        self._cache: dict[str, JobStatus] = {}
        self._accounting: bool | None = None
        self._pyslurm = _pyslurm_module() if use_pyslurm in (None, True) and runner is None else None

    def _check(self, argv: Sequence[str]) -> CommandResult:
        res = self.run(argv)
        if res.returncode in (124, 127):
            raise BackendUnavailable(f"{argv[0]}: {res.stderr.strip()}")
        return res

    # ---------------------------------------------------------------- submit
    def submit(self, spec: JobSpec) -> JobHandle:
        log_dir = spec.resolved_log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        script = log_dir / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.sbatch"
        script.touch(mode=0o600)  # exported env may hold tokens
        script.write_text(render_script(spec))
        res = self._check(["sbatch", "--parsable", *spec.slurm_args, str(script)])
        if res.returncode != 0:
            raise BackendError(f"sbatch refused {spec.name!r}: {res.stderr.strip() or res.stdout.strip()}")
        job_id = res.stdout.strip().splitlines()[-1].split(";")[0].strip()
        if not job_id.isdigit():
            raise BackendError(f"sbatch printed no job id: {res.stdout!r}")
        self._next_poll = 0.0
        return self._handle(spec, job_id)

    # ---------------------------------------------------------------- find
    def find(self, spec: JobSpec) -> JobHandle | None:
        """The Slurm job an earlier `submit(spec)` got accepted, from its batch script.

        Our scripts for this spec (same name and log directory, exporting the same
        ROOST_JOB_ID) are looked up in Slurm's queue by job name, the job's command
        being the script's path (`squeue -t all` also lists jobs that ended less than
        MinJobAge ago). A job Slurm has forgotten is known by its exit-code file,
        written after its script. No script, or a script Slurm never had: None.
        """
        scripts = self._scripts(spec)
        if not scripts:
            return None
        res = self._check(["squeue", "-h", "-t", "all", "--name", spec.name, "-o", "%i %o"])
        if res.returncode != 0:
            raise BackendUnavailable(f"squeue failed: {res.stderr.strip()}")
        for line in res.stdout.splitlines():
            job_id, _, command = line.strip().partition(" ")
            if job_id.isdigit() and command.strip() in scripts:
                return self._handle(spec, job_id)
        written = min(scripts.values())
        exit_re = re.compile(re.escape(spec.name) + r"-(\d+)\.exit")
        ended = sorted(
            (p.stat().st_mtime, m.group(1))
            for p in spec.resolved_log_dir().glob(f"{spec.name}-*.exit")
            if (m := exit_re.fullmatch(p.name)) and p.stat().st_mtime >= written
        )
        return self._handle(spec, ended[0][1]) if ended else None

    def _scripts(self, spec: JobSpec) -> dict[str, float]:
        """{path: mtime} of the batch scripts `submit` wrote for this spec."""
        mine = re.compile(re.escape(spec.name) + r"-\d{8}-\d{6}-[0-9a-f]{6}\.sbatch")
        key = spec.env.get(ENV_JOB_ID)
        marker = f"export {ENV_JOB_ID}={shlex.quote(key)}\n" if key is not None else ""
        found = {}
        for path in spec.resolved_log_dir().glob(f"{spec.name}-*.sbatch"):
            if mine.fullmatch(path.name) and marker in path.read_text(errors="replace"):
                found[str(path)] = path.stat().st_mtime
        return found

    def _handle(self, spec: JobSpec, job_id: str) -> JobHandle:
        out, err, _ = log_paths(spec, job_id)
        return JobHandle(
            backend=self.name, external_id=job_id, name=spec.name, stdout_path=str(out), stderr_path=str(err)
        )

    # ---------------------------------------------------------------- status
    def status(self, handles: Sequence[JobHandle], force: bool = False) -> dict[str, JobStatus]:
        ids = [h.external_id for h in handles]
        now = time.monotonic()
        if not force and now < self._next_poll and all(i in self._cache for i in ids):
            return {i: self._cache[i] for i in ids}
        try:
            found = self._query_all()
        except BackendUnavailable:
            self._backoff(changed=False)
            if all(i in self._cache for i in ids):
                return {i: self._cache[i] for i in ids}
            raise
        result: dict[str, JobStatus] = {}
        for h in handles:
            st = found.get(h.external_id) or self._fallback(h)
            result[h.external_id] = st
        changed = any(self._cache.get(i) != st for i, st in result.items())
        self._cache.update(result)
        self._backoff(changed)
        return result

    def reattach(self, handle: JobHandle) -> JobStatus:
        return self.status([handle], force=True)[handle.external_id]

    def _backoff(self, changed: bool) -> None:
        self._interval = self.min_poll_s if changed else min(self.max_poll_s, max(self.min_poll_s, self._interval * 2))
        self._next_poll = time.monotonic() + self._interval

    def _query_all(self) -> dict[str, JobStatus]:
        if self._pyslurm is not None:  # pragma: no cover - pyslurm is not installable here
            return _query_pyslurm(self._pyslurm)
        res = self._check(["squeue", "--json"])
        if res.returncode != 0:
            raise BackendUnavailable(f"squeue failed: {res.stderr.strip()}")
        return parse_squeue_json(res.stdout)

    def _fallback(self, h: JobHandle) -> JobStatus:
        """A job squeue no longer lists: scontrol, then sacct, then the exit-code file."""
        res = self.run(["scontrol", "show", "job", "-o", h.external_id])
        if res.returncode == 0 and res.stdout.strip():
            return parse_scontrol_line(res.stdout.strip().splitlines()[0])
        if self._has_accounting():
            res = self.run(["sacct", "--json", "-j", h.external_id])
            if res.returncode == 0:
                st = parse_sacct_json(res.stdout).get(h.external_id)
                if st is not None:
                    return st
        st = status_from_exit_file(Path(h.stdout_path).with_suffix(".exit"))
        if st is not None:
            return st
        return JobStatus(
            state=JobState.UNKNOWN, reason="Slurm no longer knows this job and it left no exit-code file (killed?)"
        )

    def _has_accounting(self) -> bool:
        if self._accounting is None:
            res = self.run(["scontrol", "show", "config"])
            self._accounting = res.returncode == 0 and any(
                line.split("=", 1)[0].strip() == "AccountingStorageType" and "accounting_storage/none" not in line
                for line in res.stdout.splitlines()
            )
        return self._accounting

    # ---------------------------------------------------------------- cancel, logs
    def cancel(self, handle: JobHandle, force: bool = False) -> None:
        """`scancel`: SIGTERM to every process of the job, SIGKILL after KillWait.

        `force` also signals the batch shell at once with SIGKILL (`--full`).
        """
        argv = ["scancel", *(["--full", "--signal=KILL"] if force else []), handle.external_id]
        res = self._check(argv)
        if res.returncode != 0 and "Invalid job id" not in res.stderr:
            raise BackendError(f"scancel {handle.external_id} failed: {res.stderr.strip()}")
        if force:  # a signal alone does not end the job in Slurm's books
            self.run(["scancel", handle.external_id])
        self._next_poll = 0.0

    def logs(self, handle: JobHandle, stream: Stream = "stdout", tail_bytes: int | None = None) -> str:
        return read_log(handle.stdout_path if stream == "stdout" else handle.stderr_path, tail_bytes)


# ---------------------------------------------------------------- optional pyslurm


def _pyslurm_module() -> object | None:
    """pyslurm, if importable and built for this cluster's Slurm major.minor."""
    try:
        import pyslurm  # type: ignore[import-not-found]  # lazy: optional, and only usable when built for this cluster
    except ImportError:
        return None
    res = subprocess_runner(["sinfo", "--version"], timeout=10)  # pragma: no cover
    cluster = res.stdout.split()[-1].split(".")[:2] if res.returncode == 0 else []  # pragma: no cover
    ours = str(getattr(pyslurm, "__version__", "")).split(".")[:2]  # pragma: no cover
    if cluster and cluster == ours:  # pragma: no cover
        return pyslurm
    log.info("pyslurm %s does not match Slurm %s; using the command line", ours, cluster)  # pragma: no cover
    return None  # pragma: no cover


def _query_pyslurm(pyslurm: object) -> dict[str, JobStatus]:  # pragma: no cover
    """pyslurm ≥ 23 API: `pyslurm.Jobs.load()` → {id: Job(state, exit_code, start_time, ...)}."""
    jobs = pyslurm.Jobs.load()  # type: ignore[attr-defined]
    out: dict[str, JobStatus] = {}
    for job_id, job in jobs.items():
        state, reason = map_state(str(job.state))
        code = job.exit_code if state in (JobState.COMPLETED, JobState.FAILED) else None
        out[str(job_id)] = JobStatus(
            state=state, exit_code=code, reason=reason, started_at=ts(job.start_time), finished_at=ts(job.end_time)
        )
    return out
