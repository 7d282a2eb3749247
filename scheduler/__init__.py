"""Job backends (local processes, Slurm) and the APScheduler daemon that watches them.

    from scheduler import JobManager, JobSpec, StoreSink
    mgr = JobManager(StoreSink())                       # records in the project database
    job = mgr.submit(JobSpec(name="hello", command=["echo", "hi"], time_limit_s=60))
    mgr.wait([job.id], timeout_s=30)

Modules, one concept each: `spec` (JobSpec), `base` (Backend interface, handles,
statuses), `local`, `slurm` (+ `fake`, a scripted Slurm for tests), `records` (where
states are kept), `manager` (submit / reconcile / cancel), `jobs` (swarm server and
client-fleet specs, trials), `register` (in-job supervisors), `daemon`, `cli`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> module. Imported lazily (PEP 562): `python -m scheduler._wrap`, which
# supervises every local job, must start in milliseconds without pydantic, SQLAlchemy
# or APScheduler.
_EXPORTS = {
    "Backend": "scheduler.base",
    "BackendError": "scheduler.base",
    "BackendUnavailable": "scheduler.base",
    "Daemon": "scheduler.daemon",
    "JobHandle": "scheduler.base",
    "JobManager": "scheduler.manager",
    "JobRecord": "scheduler.records",
    "JobSpec": "scheduler.spec",
    "JobState": "store.models",
    "JobStatus": "scheduler.base",
    "LocalBackend": "scheduler.local",
    "MemorySink": "scheduler.records",
    "SlurmBackend": "scheduler.slurm",
    "StoreSink": "scheduler.records",
    "Trial": "scheduler.jobs",
    "client_fleet_job": "scheduler.jobs",
    "make_trial": "scheduler.jobs",
    "register_tick": "scheduler.daemon",
    "render_script": "scheduler.slurm",
    "submit_trial": "scheduler.jobs",
    "swarm_server_job": "scheduler.jobs",
    "unregister_tick": "scheduler.daemon",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Daemon",
    "JobHandle",
    "JobManager",
    "JobRecord",
    "JobSpec",
    "JobState",
    "JobStatus",
    "LocalBackend",
    "MemorySink",
    "SlurmBackend",
    "StoreSink",
    "Trial",
    "client_fleet_job",
    "make_trial",
    "register_tick",
    "render_script",
    "submit_trial",
    "swarm_server_job",
    "unregister_tick",
]
