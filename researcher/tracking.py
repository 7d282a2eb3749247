"""MLflow for studies: one parent run per study, one child run per trial, the report as artifacts.

Every call is idempotent, because a resumed study repeats whatever its crash cut
short: a trial's child run is looked up by its `roost.trial_id` tag before one is
created, and logging a trial whose run is already FINISHED does nothing.

Names say what a run is: a trial's run is `<arm> seed=<seed>` (also when the trial
program's own run is adopted, which `swarm train` names after its output folder),
and the study's parent run carries the study's summary metrics (`log_summary`).
store.tracking is imported inside the functions: it imports MLflow, which takes
seconds, and the CLI's light paths never log anything.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STUDY_TAG = "roost.study_id"
TRIAL_TAG = "roost.trial_id"
RUN_NAME_TAG = "mlflow.runName"


# MLflow 3 opens an experiment in its GenAI (traces) view unless told it is machine learning. Two
# switches, both checked against the installed UI (mlflow/server/js/build, 3.17): the experiment tag
# `mlflow.experimentKind` = `custom_model_development` ("Machine learning" in the experiment's kind
# selector; the view of UIs that read the kind per experiment), and, in UIs with the global workflow
# switch (3.17 reads it first, from the browser's storage, GenAI by default), the URL parameter
# `workflowType=machine_learning`, which every link the researcher prints carries (`ui_route`).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
WORKFLOW_QUERY = "workflowType=machine_learning"
#: the trials' score, first in the runs table: the experiment's link sorts the runs by it, best first
REWARD_SORT = "orderByKey=metrics.%60trial%2Ffinal_reward%60&orderByAsc=false"


def ui_route(experiment_id: str | None, run_id: str | None = None) -> str:
    """The MLflow UI route (after the server's address) of a study's runs, or of one run: the
    training-runs view, runs sorted by final reward. Example: `#/experiments/3/runs?workflowType=...`."""
    if run_id:
        return f"#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_QUERY}"
    return f"#/experiments/{experiment_id}/runs?{WORKFLOW_QUERY}&{REWARD_SORT}"


def trial_run_name(arm: str, seed: int) -> str:
    return f"{arm} seed={seed}"


def metric_key(*parts: object) -> str:
    """An MLflow metric name from parts such as an arm name (`lr=3e-4` → `lr_3e-4`)."""
    return "/".join(re.sub(r"[^\w\-. ]", "_", str(p)) for p in parts)


def experiment_name(study_id: int, name: str) -> str:
    """One experiment per study; the study's unique name keeps a reset database's
    study 1 from landing in an older study 1's experiment."""
    return f"roost-study-{study_id}-{name[-6:]}"


def start_study_run(study_id: int, name: str, params: dict[str, Any]) -> str:
    """Create the study's parent run; returns its id."""
    from store.tracking import RunLogger  # lazy: MLflow (see the module docstring)

    run = RunLogger.start(
        experiment_name(study_id, name), run_name=name, tags={STUDY_TAG: study_id}, flush_interval_s=0
    )
    run.client.set_experiment_tag(run.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    run.log_params(params)
    return run.run_id


def _parent(run_id: str) -> Any:
    from store.tracking import RunLogger, get_client  # lazy: MLflow

    return RunLogger(get_client(), run_id, flush_interval_s=0)


def log_trial(
    study_run_id: str,
    trial_id: int,
    arm: str,
    seed: int,
    params: dict[str, Any],
    summary: dict[str, Any] | None,
    metrics: dict[str, float],
    status: str = "FINISHED",
    own_run_id: str | None = None,
) -> str:
    """The trial's child run, complete with per-step metrics; returns the run id.

    `own_run_id`: the run the trial program logged itself (`swarm train --mlflow-parent`
    makes the server's run a child of the study run, live while it trains); it is
    adopted (tagged, summarised) instead of copying its metrics into a second run.
    """
    from store.tracking import RunLogger  # lazy: MLflow

    parent = _parent(study_run_id)
    client = parent.client
    found = client.search_runs(
        [parent.experiment_id], filter_string=f"tags.`{TRIAL_TAG}` = '{trial_id}'", max_results=1
    )
    tags = {
        TRIAL_TAG: trial_id,
        STUDY_TAG: params.get("study_id", ""),
        "roost.arm": arm,
        "roost.seed": seed,
        RUN_NAME_TAG: trial_run_name(arm, seed),
    }
    if found and found[0].data.tags.get("roost.partial") == "0":
        return str(found[0].info.run_id)  # logged completely before
    if found:
        run_id, copy_steps = str(found[0].info.run_id), found[0].data.tags.get("roost.source") != "trial"
        child = RunLogger(client, run_id, flush_interval_s=0)  # half-logged (crash): finish it
        child.set_tags({RUN_NAME_TAG: tags[RUN_NAME_TAG]})
    elif own_run_id:
        child, copy_steps = RunLogger(client, own_run_id, flush_interval_s=0), False
        child.set_tags({**tags, "roost.partial": "1", "roost.source": "trial"})
    else:
        child = parent.child(
            trial_run_name(arm, seed), tags={**tags, "roost.partial": "1", "roost.source": "researcher"}
        )
        child.log_params({**params, "arm": arm, "seed": seed})
        copy_steps = True
    if copy_steps:
        for row in (summary or {}).get("steps", []):
            step = row.get("step")
            if step is None:
                continue
            values = {
                k: v
                for k, v in row.items()
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
            }
            child.log_metrics(int(step), values)
    for k, v in metrics.items():
        if v is not None and math.isfinite(float(v)):
            child.log_metrics(0, {f"trial/{k}": v})
    if summary is not None:
        child.log_json(summary, "trial_summary.json")
    child.set_tags({"roost.partial": "0"})
    child.set_terminated(status)
    return child.run_id


def log_report(study_run_id: str, report_dir: Path, analysis: dict[str, Any] | None = None) -> None:
    """The report directory (markdown + plots) as artifacts under `report/`."""
    parent = _parent(study_run_id)
    parent.log_artifact(report_dir, "report")
    if analysis is not None:
        parent.log_json(analysis, "report/analysis.json")


def log_summary(study_run_id: str, metrics: Mapping[str, float | None], tags: Mapping[str, Any]) -> None:
    """The study's summary on its parent run: metrics (step 0) and tags such as the verdicts."""
    parent = _parent(study_run_id)
    parent.log_metrics(0, {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))})
    parent.set_tags(dict(tags))
    parent.flush()


def log_reward_curves(study_run_id: str, curves: Mapping[str, tuple[list[float], list[float]]]) -> None:
    """Each arm's mean reward per step on the study's run, as `reward_mean/<arm>`: its run page then
    charts the arms' rewards side by side, beside the summary numbers."""
    parent = _parent(study_run_id)
    for arm, (steps, values) in curves.items():
        for step, value in zip(steps, values, strict=True):
            if math.isfinite(value):
                parent.log_metrics(int(step), {metric_key("reward_mean", arm): value})
    parent.flush()


def run_status(status: str) -> str:
    """MLflow's end state for a study's or a trial's: a cancelled one is KILLED (MLflow's word for
    stopped by hand), so the runs list does not show a study someone stopped as a finished one."""
    return {"COMPLETED": "FINISHED", "CANCELLED": "KILLED"}.get(str(status), "FAILED")


def finish_study_run(study_run_id: str, status: str = "FINISHED") -> None:
    from store.tracking import get_client  # lazy: MLflow

    get_client().set_terminated(study_run_id, status=status)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
