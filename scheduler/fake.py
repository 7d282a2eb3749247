"""A fake Slurm for unit tests: a command runner with explicit state setters (as submitit's).

    fake = FakeSlurm()
    backend = SlurmBackend(runner=fake, min_poll_s=0)
    h = backend.submit(spec)                 # fake records the script; job is PENDING
    fake.set_state(h.external_id, "RUNNING")
    fake.set_state(h.external_id, "FAILED", exit_code=3)
    fake.forget(h.external_id, squeue=True)  # gone from squeue; scontrol still knows it

It answers `sbatch --parsable`, `squeue --json` (Slurm 22.05's shape, or 23.02+'s with
`json_version="0.0.40"`), `squeue -h -t all --name N -o "%i %o"`, `scontrol show job -o
ID`, `scontrol show config`, `sacct --json -j ID` (only with `accounting=True`) and `scancel`. Every call is kept in
`calls` so tests can assert what was run (e.g. one squeue per poll).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.slurm import CommandResult


@dataclass
class FakeJob:
    job_id: int
    name: str
    script: str
    args: list[str]
    state: str = "PENDING"
    exit_code: int = 0
    signal: int = 0
    start_time: int = 0
    end_time: int = 0
    reason: str = "None"
    in_squeue: bool = True
    in_scontrol: bool = True
    path: str = ""  # the batch script's path, what `squeue -o %o` prints

    def sbatch_option(self, key: str) -> str | None:
        """The value of an #SBATCH option (or a command-line one, which wins)."""
        found = None
        for line in self.script.splitlines():
            m = re.match(rf"#SBATCH\s+--{re.escape(key)}=(\S+)", line)
            if m:
                found = m.group(1)
        for a in self.args:
            if a.startswith(f"--{key}="):
                found = a.split("=", 1)[1]
        return found


@dataclass
class FakeSlurm:
    """In-memory slurmctld driven by the test (nothing runs)."""

    json_version: str = "0.0.38"
    accounting: bool = False
    down: bool = False  # every command fails as if the controller did not answer
    next_id: int = 1000
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    # ---------------------------------------------------------------- setters
    def set_state(
        self, job_id: str | int, state: str, exit_code: int = 0, signal: int = 0, reason: str = "None"
    ) -> None:
        job = self.jobs[int(job_id)]
        now = int(time.time())
        if state not in ("PENDING",) and not job.start_time:
            job.start_time = now
        if state not in ("PENDING", "RUNNING", "COMPLETING", "SUSPENDED"):
            job.end_time = now
        job.state, job.exit_code, job.signal, job.reason = state, exit_code, signal, reason

    def forget(self, job_id: str | int, squeue: bool = True, scontrol: bool = False) -> None:
        """Drop a job from squeue (and, with `scontrol`, from scontrol: MinJobAge passed)."""
        job = self.jobs[int(job_id)]
        if squeue:
            job.in_squeue = False
        if scontrol:
            job.in_scontrol = False

    def count(self, command: str) -> int:
        return sum(1 for c in self.calls if c and c[0] == command)

    # ---------------------------------------------------------------- the runner
    def __call__(self, argv: Sequence[str]) -> CommandResult:
        argv = list(argv)
        self.calls.append(argv)
        if self.down:
            return CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller")
        handler = {
            "sbatch": self._sbatch,
            "squeue": self._squeue,
            "scontrol": self._scontrol,
            "sacct": self._sacct,
            "scancel": self._scancel,
        }.get(argv[0])
        if handler is None:
            return CommandResult(127, "", f"{argv[0]}: command not found")
        return handler(argv[1:])

    def _sbatch(self, args: list[str]) -> CommandResult:
        script_path = args[-1]
        with open(script_path) as f:
            script = f.read()
        if "--time=" not in script:
            return CommandResult(1, "", "sbatch: error: fake requires --time")
        job_id = self.next_id
        self.next_id += 1
        name = re.search(r"--job-name=(\S+)", script)
        self.jobs[job_id] = FakeJob(job_id, name.group(1) if name else "job", script, args[:-1], path=script_path)
        if "--hold" in args:
            self.jobs[job_id].reason = "JobHeldUser"
        return CommandResult(0, f"{job_id}\n" if "--parsable" in args else f"Submitted batch job {job_id}\n", "")

    def _exit_field(self, job: FakeJob) -> object:
        if self.json_version == "0.0.38":
            return job.signal if job.signal else job.exit_code << 8
        return {
            "status": ["SIGNALED" if job.signal else "EXITED"],
            "return_code": {"set": True, "infinite": False, "number": job.exit_code},
            "signal": {"id": {"set": bool(job.signal), "infinite": False, "number": job.signal}, "name": ""},
        }

    def _time_field(self, t: int) -> object:
        return t if self.json_version == "0.0.38" else {"set": bool(t), "infinite": False, "number": t}

    def _squeue(self, args: list[str]) -> CommandResult:
        if "--json" not in args:
            return self._squeue_lines(args)
        jobs = []
        for job in self.jobs.values():
            if not job.in_squeue:
                continue
            jobs.append(
                {
                    "job_id": job.job_id,
                    "name": job.name,
                    "job_state": job.state if self.json_version == "0.0.38" else [job.state],
                    "exit_code": self._exit_field(job),
                    "state_reason": job.reason,
                    "start_time": self._time_field(job.start_time),
                    "end_time": self._time_field(job.end_time),
                }
            )
        return CommandResult(
            0,
            json.dumps(
                {"meta": {"plugin": {"name": f"Slurm OpenAPI v{self.json_version}"}}, "errors": [], "jobs": jobs}
            ),
            "",
        )

    def _squeue_lines(self, args: list[str]) -> CommandResult:
        """`squeue -h [-t all] [--name N] -o "%i %o"`: id and script path per line."""
        if args[args.index("-o") + 1] != "%i %o":
            return CommandResult(1, "", f"squeue: fake supports only -o '%i %o', got {args}")
        name = args[args.index("--name") + 1] if "--name" in args else None
        every = "-t" in args and args[args.index("-t") + 1] == "all"
        lines = [
            f"{j.job_id} {j.path}"
            for j in self.jobs.values()
            if (name is None or j.name == name) and (j.in_squeue or every and j.in_scontrol)
        ]
        return CommandResult(0, "".join(f"{line}\n" for line in lines), "")

    def _scontrol(self, args: list[str]) -> CommandResult:
        if args[:2] == ["show", "config"]:
            kind = "accounting_storage/slurmdbd" if self.accounting else "accounting_storage/none"
            return CommandResult(0, f"AccountingStorageType   = {kind}\nClusterName = fake\n", "")
        if args[:2] == ["show", "job"]:
            job = self.jobs.get(int(args[-1]))
            if job is None or not job.in_scontrol:
                return CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified")

            def _t(t: int) -> str:
                return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "Unknown"

            line = (
                f"JobId={job.job_id} JobName={job.name} JobState={job.state} Reason={job.reason} "
                f"ExitCode={job.exit_code}:{job.signal} StartTime={_t(job.start_time)} "
                f"EndTime={_t(job.end_time)} NtasksPerN:B:S:C=0:0:*:*"
            )
            return CommandResult(0, line + "\n", "")
        return CommandResult(1, "", f"scontrol: unsupported {args}")

    def _sacct(self, args: list[str]) -> CommandResult:
        if not self.accounting:
            return CommandResult(1, "", "sacct: error: Slurm accounting storage is disabled")
        ids = {int(x) for x in args[args.index("-j") + 1].split(",")}
        jobs = [
            {
                "job_id": j.job_id,
                "state": {"current": j.state, "reason": j.reason},
                "exit_code": {
                    "status": "SUCCESS" if not j.exit_code else "ERROR",
                    "return_code": j.exit_code,
                    "signal": {"signal_id": j.signal},
                },
                "time": {"start": j.start_time, "end": j.end_time},
            }
            for j in self.jobs.values()
            if j.job_id in ids
        ]
        return CommandResult(0, json.dumps({"jobs": jobs}), "")

    def _scancel(self, args: list[str]) -> CommandResult:
        job = self.jobs.get(int(args[-1]))
        if job is None:
            return CommandResult(
                1, "", f"scancel: error: Kill job error on job id {args[-1]}: Invalid job id specified"
            )
        if job.state in ("PENDING", "RUNNING", "COMPLETING", "SUSPENDED"):
            self.set_state(job.job_id, "CANCELLED", signal=15 if job.state != "PENDING" else 0)
        return CommandResult(0, "", "")
