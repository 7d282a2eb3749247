"""A run's summary.json: the run in a few numbers, how it ended, and what its workflow's failures were.

`swarm train`, `--attach` and `--team` all end here, so a run reads the same whichever way it ran (every
field is documented in the README, "The run folder"). Rewards are the means of the first and the last few
steps; a run of several policies (--shared-base, a team) combines its roles' (`combine_roles`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from swarm.config.run import RunConfig
from swarm.fleet_alerts import run_failures
from swarm.run_checks import METRICS, RUN_FILE, read_metrics


def summarize(rows: list[dict], wall_s: float, spec: RunConfig, window: int = 5) -> dict:
    """The run in a few numbers; the per-step rows stay in `METRICS` (named, not copied).
    Rewards are means over the first and the last `window` steps (`reward_window`), fewer in a run of
    under twice as many steps: the two means never share a step (a 3-step run read 0.341 -> 0.341, each
    the mean of all three, while its reward rose from 0.312 to 0.375)."""
    window = max(1, min(window, len(rows) // 2))

    def first_last(key: str) -> tuple[float | None, float | None, int]:
        curve = [float(r[key]) for r in rows if r.get(key) is not None]
        head, tail = curve[:window], curve[-window:]
        return (sum(head) / len(head) if head else None), (sum(tail) / len(tail) if tail else None), len(curve)

    reward_first, reward_last, _ = first_last("reward_mean")
    families = {}
    for key in sorted({k for r in rows for k in r if k.startswith("reward_mean/")}):
        first, last, seen = first_last(key)
        families[key.partition("/")[2]] = {"reward_first_mean": first, "reward_last_mean": last, "steps_seen": seen}

    def median(key: str) -> float | None:  # from step 2: step 1 also waits for the clients to start
        vals = sorted(float(r[key]) for r in rows[1:] if isinstance(r.get(key), (int, float)))
        return round(vals[len(vals) // 2], 4) if vals else None

    server = spec.server
    return {
        "status": "finished",
        "task": spec.task or (None if spec.workflow else "arith"),
        "workflow": spec.workflow,
        "model": str(server.model_dir),
        "config": {
            "steps": spec.steps,
            "group_size": server.group_size,
            "batch_groups": server.batch_groups,
            "lr": server.train.lr,
            "advantage": str(server.train.advantage),
            "loss_agg": str(server.train.loss_agg),
            "kl_coef": server.train.kl_coef,
            "seed": server.seed,
            "clients": spec.clients,
            "concurrency": spec.concurrency,
            "temperature": server.temperature,
            "merge": server.merge,
            "per_episode_norm": server.per_episode_norm,
            "group_call": spec.grouped,
        },
        "run_file": RUN_FILE,
        "metrics": METRICS,
        "steps_done": len(rows),
        "reward_window": window,
        "reward_first_mean": reward_first,
        "reward_last_mean": reward_last,
        "families": families,
        "timing": {
            "collection_s": median("wall_window_s"),
            "engine_busy_s": median("gen_busy_s"),
            "train_s": median("wall_train_s"),
        },  # per step, medians
        "wall_s": round(wall_s, 2),
    }


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def combine_roles(per: dict[str, dict]) -> dict:
    """The run's own numbers from its roles' summaries: rewards (the run's and each task family's) the mean
    of the roles', `steps_done` the slowest role's. Step timings stay per role: one role's steps say nothing
    of another's (the first role's used to stand for the run, as did its families)."""
    summary = {k: v for k, v in next(iter(per.values())).items() if k != "timing"}
    for key in ("reward_first_mean", "reward_last_mean"):
        summary[key] = _mean(p[key] for p in per.values())
    families = {}
    for name in sorted({f for p in per.values() for f in p["families"]}):
        rows = [p["families"][name] for p in per.values() if name in p["families"]]
        families[name] = {
            "reward_first_mean": _mean(r["reward_first_mean"] for r in rows),
            "reward_last_mean": _mean(r["reward_last_mean"] for r in rows),
            "steps_seen": max(r["steps_seen"] for r in rows),
        }
    summary["families"] = families
    summary["steps_done"] = min(p["steps_done"] for p in per.values())
    return summary


def summarize_policies(spec: RunConfig, metrics: dict[str, Path], wall_s: float) -> dict:
    """A --shared-base run: each role's summary under `policies`, the run's numbers combined (`combine_roles`)."""
    per = {role: summarize(read_metrics(path), wall_s, spec) for role, path in metrics.items()}
    summary = combine_roles(per)
    summary["metrics"] = {role: str(path.relative_to(spec.out)) for role, path in metrics.items()}
    summary["policies"] = {
        role: {k: p[k] for k in ("reward_first_mean", "reward_last_mean", "steps_done", "families", "timing")}
        for role, p in per.items()
    }
    return summary


class ServerStopped(RuntimeError):
    """The run's server stopped cleanly before the run's steps (`swarm ctl stop`, a signal to it): no failure,
    and `--resume` goes on from its last checkpoint."""

    def __init__(self, done: int | str, steps: int, server: str = "the server", its: str = "its") -> None:
        super().__init__(
            f"{server} was stopped (`swarm ctl stop`, or a signal to it) after {done} of {steps} steps; "
            f"`swarm train --resume` goes on from {its} last checkpoint"
        )


def ended(exc: BaseException) -> dict[str, str]:
    """The `status` and `error` of summary.json for a run (or a team run) that did not reach its steps."""
    status = (
        "stopped"
        if isinstance(exc, ServerStopped)
        else "interrupted"
        if isinstance(exc, KeyboardInterrupt)
        else "failed"
    )
    return {"status": status, "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}


def write_summary(out: Path, summary: dict) -> None:
    """summary.json, with the workflow's failures when it had any (the first of each kind per fleet, as
    `swarm train` printed them; their logs hold the tracebacks)."""
    if failures := run_failures(out):
        summary["workflow_failures"] = failures
    (out / "summary.json").write_text(json.dumps(summary, indent=2))


__all__ = ["ServerStopped", "combine_roles", "ended", "summarize", "summarize_policies", "write_summary"]
