"""Scheduler-daemon ticks: every active study advances one step per tick.

    researcher daemon                    # registers the tick, then runs the scheduler daemon
    # or, with a scheduler daemon already running:
    from scheduler.daemon import register_tick
    register_tick("researcher", "researcher.daemon:tick", interval_s=30)

A tick never waits on trials: `advance` reconciles them once and returns. A study
driven by a foreground process right now is skipped (its lock is taken).
"""

from __future__ import annotations

import logging

from researcher.runner import active_studies, advance
from scheduler.daemon import register_tick

log = logging.getLogger(__name__)

TICK_NAME = "researcher"
TICK_REF = "researcher.daemon:tick"


def tick(study_id: int | None = None) -> dict[int, str]:
    """Advance one study (or every ACTIVE one); {study id: resulting state}."""
    ids = [study_id] if study_id is not None else active_studies()
    out = {}
    for sid in ids:
        try:
            out[sid] = advance(sid).state
        except Exception:  # one broken study must not stop the others
            log.exception("study %s: tick failed", sid)
            out[sid] = "error"
    if out:
        log.info("researcher tick: %s", out)
    return out


def register(interval_s: float = 30.0, db_url: str | None = None) -> str:
    return register_tick(TICK_NAME, TICK_REF, interval_s, db_url=db_url)
