"""Pure parsing of Slurm's answers: states, exit codes, `squeue --json`, `scontrol -o`, `sacct --json`.

Handles both JSON shapes: Slurm 22.05 (openapi v0.0.38: `job_state` a string,
`exit_code` a raw wait status, times plain epoch seconds) and 23.02+ (v0.0.39 and
later: `job_state` a list of flags, `exit_code` an object, times `{set, number}`).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler.base import JobStatus
from store.models import JobState

# Slurm base state → (our state, reason worth keeping). Anything not listed: UNKNOWN.
_STATE_MAP: dict[str, tuple[JobState, str | None]] = {
    "PENDING": (JobState.PENDING, None),
    "REQUEUED": (JobState.PENDING, "requeued"),
    "REQUEUE_FED": (JobState.PENDING, "requeued"),
    "REQUEUE_HOLD": (JobState.PENDING, "requeued and held"),
    "RESV_DEL_HOLD": (JobState.PENDING, "held: reservation deleted"),
    "CONFIGURING": (JobState.PENDING, "nodes configuring"),
    "POWER_UP_NODE": (JobState.PENDING, "nodes powering up"),
    "RUNNING": (JobState.RUNNING, None),
    "COMPLETING": (JobState.RUNNING, "completing"),
    "SUSPENDED": (JobState.RUNNING, "suspended"),
    "STOPPED": (JobState.RUNNING, "stopped"),
    "RESIZING": (JobState.RUNNING, None),
    "SIGNALING": (JobState.RUNNING, None),
    "STAGE_OUT": (JobState.RUNNING, "staging out"),
    "UPDATE_DB": (JobState.RUNNING, None),
    "COMPLETED": (JobState.COMPLETED, None),
    "FAILED": (JobState.FAILED, None),
    "OUT_OF_MEMORY": (JobState.FAILED, "OUT_OF_MEMORY"),
    "NODE_FAIL": (JobState.FAILED, "NODE_FAIL"),
    "BOOT_FAIL": (JobState.FAILED, "BOOT_FAIL"),
    "LAUNCH_FAILED": (JobState.FAILED, "LAUNCH_FAILED"),
    "SPECIAL_EXIT": (JobState.FAILED, "SPECIAL_EXIT"),
    "PREEMPTED": (JobState.FAILED, "PREEMPTED"),
    "CANCELLED": (JobState.CANCELLED, None),
    "REVOKED": (JobState.CANCELLED, "REVOKED (federation)"),
    "TIMEOUT": (JobState.TIMEOUT, None),
    "DEADLINE": (JobState.TIMEOUT, "DEADLINE"),
}

_FINISHED = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)


def map_state(raw: str | list[str] | None) -> tuple[JobState, str | None]:
    """Slurm's state (e.g. "CANCELLED by 0", ["FAILED"], "CD") → (JobState, reason)."""
    if isinstance(raw, list):
        raw = next((r for r in raw if r.upper() in _STATE_MAP), raw[0] if raw else None)
    if not raw:
        return JobState.UNKNOWN, "no state reported"
    base = str(raw).split()[0].rstrip("+").upper()
    base = _SHORT.get(base, base)
    if base in _STATE_MAP:
        return _STATE_MAP[base]
    return JobState.UNKNOWN, f"unrecognised Slurm state {raw!r}"


_SHORT = {
    "PD": "PENDING",
    "R": "RUNNING",
    "CG": "COMPLETING",
    "CD": "COMPLETED",
    "F": "FAILED",
    "CA": "CANCELLED",
    "TO": "TIMEOUT",
    "OOM": "OUT_OF_MEMORY",
    "NF": "NODE_FAIL",
    "PR": "PREEMPTED",
    "S": "SUSPENDED",
    "CF": "CONFIGURING",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "RQ": "REQUEUED",
    "SE": "SPECIAL_EXIT",
    "ST": "STOPPED",
}


def _number(value: Any) -> int | None:
    """An int from 22.05's plain numbers or 23.02+'s {"set": bool, "number": n}."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def ts(value: Any) -> datetime | None:
    """Epoch seconds (0 or unset: None) → aware UTC datetime."""
    n = _number(value)
    return datetime.fromtimestamp(n, UTC) if n else None


def decode_exit(value: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) from a raw wait status int, an exit_code object, or "3:0"."""
    if value is None:
        return None, None
    if isinstance(value, dict):
        code = _number(value.get("return_code"))
        sig = value.get("signal") or {}
        signum = _number(sig.get("id", sig.get("signal_id")) if isinstance(sig, dict) else sig)
        return code, signum or None
    if isinstance(value, str):
        code_s, _, sig_s = value.partition(":")
        return (int(code_s) if code_s.isdigit() else None), (int(sig_s) if sig_s.isdigit() and int(sig_s) else None)
    status = _number(value)
    if status is None:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def _make_status(raw_state: Any, exit_value: Any, start: Any, end: Any, slurm_reason: str | None = None) -> JobStatus:
    state, reason = map_state(raw_state)
    code, signum = decode_exit(exit_value)
    exit_code: int | None = None
    if state in _FINISHED:
        exit_code = 128 + signum if signum else code
        if signum and not reason:
            reason = f"killed by signal {signum}"
        elif state is JobState.FAILED and not reason and code:
            reason = f"exit code {code}"
    if state is JobState.PENDING and slurm_reason and slurm_reason not in ("None", "none"):
        reason = reason or slurm_reason
    return JobStatus(
        state=state,
        exit_code=exit_code,
        reason=reason,
        started_at=ts(start),
        finished_at=ts(end) if state in _FINISHED else None,
    )


def parse_squeue_json(text: str) -> dict[str, JobStatus]:
    """`squeue --json` → {job id: status} for every job it lists."""
    data = json.loads(text)
    out: dict[str, JobStatus] = {}
    for job in data.get("jobs", []):
        job_id = str(_number(job.get("job_id")))
        out[job_id] = _make_status(
            job.get("job_state"),
            job.get("exit_code"),
            job.get("start_time"),
            job.get("end_time"),
            job.get("state_reason"),
        )
    return out


_KV = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)")


def parse_scontrol_line(line: str) -> JobStatus:
    """One line of `scontrol show job -o ID` (Key=Value pairs) → status."""
    kv = dict(_KV.findall(line))

    def _t(key: str) -> float | None:
        v = kv.get(key)
        if not v or v in ("Unknown", "None", "N/A"):
            return None
        # scontrol prints local time without a zone.
        return datetime.fromisoformat(v).astimezone(UTC).timestamp()

    return _make_status(kv.get("JobState"), kv.get("ExitCode"), _t("StartTime"), _t("EndTime"), kv.get("Reason"))


def parse_sacct_json(text: str) -> dict[str, JobStatus]:
    """`sacct --json -j ID` → {job id: status} (the allocation, not its steps)."""
    data = json.loads(text)
    out: dict[str, JobStatus] = {}
    for job in data.get("jobs", []):
        job_id = str(_number(job.get("job_id")))
        st = job.get("state") or {}
        raw = st.get("current") if isinstance(st, dict) else st
        times = job.get("time") or {}
        out[job_id] = _make_status(
            raw,
            job.get("exit_code"),
            times.get("start"),
            times.get("end"),
            st.get("reason") if isinstance(st, dict) else None,
        )
    return out


def status_from_exit_file(path: Path) -> JobStatus | None:
    """The exit code a batch script recorded; None if it never got there."""
    try:
        text = path.read_text().strip()
        code = int(text)
    except (FileNotFoundError, ValueError):
        return None
    if code == 0:
        return JobStatus(state=JobState.COMPLETED, exit_code=0)
    return JobStatus(state=JobState.FAILED, exit_code=code, reason=f"exit code {code}")
