"""Reading runs back for analysis: metric histories as numpy arrays or a DataFrame.

    hist = metric_histories([run_a, run_b], "reward")      # {run_id: (steps, values)}
    df = histories_frame([run_a, run_b], ["reward", "loss"],
                         labels={run_a: {"arm": "base", "seed": 0}, ...})
    df = trial_histories_frame(trials, "reward")           # labelled by trial id, arm, seed
    curves = histories_by_arm(trials, "reward")            # {arm: [(steps, values), ...]}

A history is sorted by step; when a step was logged more than once (a resumed
run re-logging a step), the value logged last wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from mlflow import MlflowClient
from sqlmodel import Session, select

from store.models import RunSummary, Trial
from store.tracking import get_client
from store.types import utcnow

History = tuple[np.ndarray, np.ndarray]

FRAME_COLUMNS = ["run_id", "key", "step", "value", "timestamp_ms"]


def _client(client: MlflowClient | None, tracking_uri: str | None) -> MlflowClient:
    return client if client is not None else get_client(tracking_uri)


def _history(client: MlflowClient, run_id: str, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    metrics = client.get_metric_history(run_id, key)
    if not metrics:
        empty = np.empty(0, dtype=np.int64)
        return empty, np.empty(0, dtype=np.float64), empty.copy()
    # Sort by (step, timestamp); keep the last entry per step.
    ordered = sorted(metrics, key=lambda m: (m.step, m.timestamp))
    steps = np.fromiter((m.step for m in ordered), dtype=np.int64, count=len(ordered))
    values = np.fromiter((m.value for m in ordered), dtype=np.float64, count=len(ordered))
    stamps = np.fromiter((m.timestamp for m in ordered), dtype=np.int64, count=len(ordered))
    last = np.append(steps[1:] != steps[:-1], True)
    return steps[last], values[last], stamps[last]


def metric_histories(
    run_ids: Iterable[str],
    key: str,
    *,
    tracking_uri: str | None = None,
    client: MlflowClient | None = None,
) -> dict[str, History]:
    """`{run_id: (steps int64[], values float64[])}` for one metric key.

    A run that never logged `key` maps to two empty arrays.
    """
    c = _client(client, tracking_uri)
    out: dict[str, History] = {}
    for run_id in run_ids:
        steps, values, _ = _history(c, run_id, key)
        out[run_id] = (steps, values)
    return out


def histories_frame(
    run_ids: Iterable[str],
    keys: str | Sequence[str],
    *,
    labels: Mapping[str, Mapping[str, Any]] | None = None,
    tracking_uri: str | None = None,
    client: MlflowClient | None = None,
) -> pd.DataFrame:
    """Long-format histories: one row per (run_id, key, step) with value and timestamp.

    `labels[run_id]` adds columns (e.g. arm, seed) so the frame groups directly:
    `df[df.key == "reward"].groupby(["arm", "step"]).value.mean()`.
    """
    c = _client(client, tracking_uri)
    key_list = [keys] if isinstance(keys, str) else list(keys)
    label_cols = sorted({col for lab in (labels or {}).values() for col in lab})
    parts = []
    for run_id in run_ids:
        for key in key_list:
            steps, values, stamps = _history(c, run_id, key)
            part = pd.DataFrame({"run_id": run_id, "key": key, "step": steps, "value": values, "timestamp_ms": stamps})
            for col in label_cols:
                part[col] = (labels or {}).get(run_id, {}).get(col)
            parts.append(part)
    if not parts or all(p.empty for p in parts):
        return pd.DataFrame(columns=FRAME_COLUMNS + label_cols)
    frame = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    return frame[FRAME_COLUMNS + label_cols]


def trial_histories_frame(trials: Iterable[Trial], keys: str | Sequence[str], **kwargs: Any) -> pd.DataFrame:
    """`histories_frame` for trials (those with an MLflow run), labelled with
    `trial_id`, `arm` and `seed`."""
    labels = {t.mlflow_run_id: {"trial_id": t.id, "arm": t.arm, "seed": t.seed} for t in trials if t.mlflow_run_id}
    return histories_frame(list(labels), keys, labels=labels, **kwargs)


def histories_by_arm(trials: Iterable[Trial], key: str, **kwargs: Any) -> dict[str, list[History]]:
    """`{arm: [(steps, values) per seed]}`: the input of `store.plots.reward_curves`."""
    trial_list = [t for t in trials if t.mlflow_run_id]
    hist = metric_histories([t.mlflow_run_id for t in trial_list], key, **kwargs)  # type: ignore[misc]
    out: dict[str, list[History]] = {}
    for t in sorted(trial_list, key=lambda t: (t.arm, t.seed)):
        out.setdefault(t.arm, []).append(hist[t.mlflow_run_id])  # type: ignore[index]
    return out


def save_run_summary(
    session: Session, mlflow_run_id: str, metrics: Mapping[str, float], *, trial_id: int | None = None
) -> RunSummary:
    """Insert or update the `RunSummary` of one run (not committed: the caller's session)."""
    row = session.exec(select(RunSummary).where(RunSummary.mlflow_run_id == mlflow_run_id)).first()
    if row is None:
        row = RunSummary(mlflow_run_id=mlflow_run_id, trial_id=trial_id, metrics=dict(metrics))
    else:
        row.metrics = dict(metrics)
        row.trial_id = trial_id if trial_id is not None else row.trial_id
        row.updated_at = utcnow()
    session.add(row)
    session.flush()
    return row
