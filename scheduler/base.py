"""The backend interface: submit, status (batched), cancel, logs, reattach, find.

Every backend (local processes, Slurm) implements `Backend`. A backend keeps no state
that matters across restarts: everything needed to find a job again is in its
`JobHandle` (stored in the `jobs` table), so a restarted scheduler calls
`reattach(handle)` / `status(handles)` and carries on. A submitter that died between
starting a job and recording its handle asks `find(spec)`: each backend looks in its
own records, so no caller needs to know how jobs are kept.

States are the store's `JobState` (Slurm's vocabulary). Backend-specific detail that
the state alone loses (OUT_OF_MEMORY, NODE_FAIL, "killed by the runaway guard") goes
into `JobStatus.reason`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from scheduler.spec import JobSpec
from store.models import JobState

TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})

Stream = Literal["stdout", "stderr"]


class BackendError(RuntimeError):
    """A backend refused or failed an operation (e.g. sbatch rejected the script)."""


class BackendUnavailable(BackendError):
    """The backend could not be asked at all (controller down); try again later.

    Callers keep their last known states instead of recording UNKNOWN.
    """


class JobHandle(BaseModel):
    """How to find a submitted job again, also after the scheduler restarts.

    `external_id` is the Slurm job id, or for local jobs "PID:START_TICKS" (the start
    time from /proc guards against a recycled pid being mistaken for the job).
    """

    model_config = ConfigDict(frozen=True)

    backend: str
    external_id: str
    name: str
    stdout_path: str
    stderr_path: str


class JobStatus(BaseModel):
    """What a backend knows about one job right now."""

    model_config = ConfigDict(frozen=True)

    state: JobState
    exit_code: int | None = None
    reason: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@runtime_checkable
class Backend(Protocol):
    """One way of running jobs. Implementations: `LocalBackend`, `SlurmBackend`."""

    name: str

    def submit(self, spec: JobSpec) -> JobHandle:
        """Start (or queue) the job; returns at once with its handle."""
        ...

    def status(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """States of many jobs in one query, keyed by `external_id`.

        Raises `BackendUnavailable` when the backend cannot be asked at all.
        """
        ...

    def cancel(self, handle: JobHandle, force: bool = False) -> None:
        """Ask the job to stop (SIGTERM, then SIGKILL after a grace); `force`: kill now."""
        ...

    def logs(self, handle: JobHandle, stream: Stream = "stdout", tail_bytes: int | None = None) -> str:
        """The job's output so far."""
        ...

    def reattach(self, handle: JobHandle) -> JobStatus:
        """Take a job submitted by an earlier process back under management."""
        ...

    def find(self, spec: JobSpec) -> JobHandle | None:
        """The job an earlier `submit(spec)` started, when its handle was never recorded.

        The backend's own records answer (the local wrapper's job directory, Slurm's
        queue and the batch scripts): same name and log directory, and the same
        `ROOST_JOB_ID` when the spec carries one. None when nothing of it was started.
        Raises `BackendUnavailable` when it cannot tell (then submitting again could
        run the job twice).
        """
        ...


def read_log(path: str | Path, tail_bytes: int | None = None) -> str:
    """A log file's text (its last `tail_bytes` bytes if given); '' when it does not exist yet."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            if tail_bytes is not None:
                size = f.seek(0, 2)
                f.seek(max(0, size - tail_bytes))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
