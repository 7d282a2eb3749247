"""MLflow tracking on a local SQLite store: batching, nesting, histories, artifacts."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from store import (
    RunLogger,
    Study,
    Trial,
    histories_frame,
    metric_histories,
    migrate,
    reward_curves,
    session_scope,
    tracking_uri,
)
from store.query import histories_by_arm, save_run_summary, trial_histories_frame


def _reward(seed: int, step: int) -> float:
    return round(0.1 * seed + step / 100, 6)


def test_default_store_nested_runs_histories_and_plot(mlflow_template_db: Path) -> None:
    """No configuration: SQLite + artifacts under ROOST_HOME, absolute paths."""
    home = Path(os.environ["ROOST_HOME"])
    assert tracking_uri() == f"sqlite:///{home / 'mlflow.db'}"
    shutil.copyfile(mlflow_template_db, home / "mlflow.db")  # skip MLflow's slow table creation
    with RunLogger.start("study-default", run_name="study", tags={"roost.study_id": 1}) as study:
        children = []
        for seed in range(3):
            with study.child(f"base s{seed}", tags={"roost.arm": "base"}) as run:
                run.log_params({"lr": 1e-5, "seed": seed})
                for step in range(0, 50, 5):
                    run.log_metrics(step, {"reward": _reward(seed, step), "loss": 1.0 / (step + 1)})
                children.append(run.run_id)
        hist = metric_histories(children, "reward")
        png = reward_curves({"base": list(hist.values())}, home / "reward.png")
        study.log_artifact(png, "plots")
        study.log_json({"best_arm": "base"}, "summary.json")
        study.log_samples(10, [{"prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-0.5]}])

    client = study.client
    assert (home / "mlflow.db").exists()
    for seed, run_id in enumerate(children):
        run = client.get_run(run_id)
        assert run.data.tags[MLFLOW_PARENT_RUN_ID] == study.run_id
        assert run.data.params == {"lr": "1e-05", "seed": str(seed)}
        assert run.info.status == "FINISHED"
        steps, values = hist[run_id]
        assert steps.dtype == np.int64 and values.dtype == np.float64
        assert steps.tolist() == list(range(0, 50, 5))
        assert values.tolist() == [_reward(seed, s) for s in range(0, 50, 5)]
    parent = client.get_run(study.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.info.artifact_uri.startswith((home / "mlartifacts").as_uri())
    paths = {a.path for a in client.list_artifacts(study.run_id, "plots")}
    assert paths == {"plots/reward.png"}
    local = Path(client.download_artifacts(study.run_id, "plots/reward.png", str(home / "dl")))
    assert local.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = Path(client.download_artifacts(study.run_id, "summary.json", str(home / "dl")))
    assert json.loads(summary.read_text()) == {"best_arm": "base"}
    samples = Path(client.download_artifacts(study.run_id, "samples/step_000010.jsonl", str(home / "dl")))
    assert json.loads(samples.read_text().splitlines()[0])["completion_ids"] == [3]


def test_metrics_are_batched_never_one_call_each(mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunLogger.start("batching", tracking_uri=mlflow_uri, flush_interval_s=0)
    calls: list[int] = []
    real = run.client.log_batch

    def spy(run_id, metrics=(), params=(), tags=(), **kw):  # type: ignore[no-untyped-def]
        calls.append(len(metrics))
        return real(run_id, metrics=metrics, params=params, tags=tags, **kw)

    monkeypatch.setattr(run.client, "log_batch", spy)
    monkeypatch.setattr(run.client, "log_metric", lambda *a, **k: pytest.fail("log_metric called"))
    for step in range(1250):
        run.log_metrics(step, {"a": step, "b": np.float32(step) * 2})  # 2 per step
    assert calls == [1000, 1000]  # flushed on size; 500 still buffered
    run.set_terminated()
    assert calls == [1000, 1000, 500]
    hist = metric_histories([run.run_id], "b", tracking_uri=mlflow_uri)[run.run_id]
    assert len(hist[0]) == 1250 and hist[1][-1] == 2 * 1249.0


def test_metrics_flush_on_time_without_close(mlflow_uri: str) -> None:
    run = RunLogger.start("timed", tracking_uri=mlflow_uri, flush_size=10_000, flush_interval_s=0.2)
    run.log_metrics(0, {"reward": 0.25})
    run.log_metrics(1, {"reward": 0.5})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        steps, values = metric_histories([run.run_id], "reward", tracking_uri=mlflow_uri)[run.run_id]
        if len(steps) == 2:
            break
        time.sleep(0.1)
    assert values.tolist() == [0.25, 0.5]
    run.set_terminated()


def test_resume_and_failed_status(mlflow_uri: str) -> None:
    with pytest.raises(ValueError):
        with RunLogger.start("resume", run_name="r", tracking_uri=mlflow_uri) as run:
            run.log_metrics(0, {"reward": 0.1})
            raise ValueError("boom")
    assert run.client.get_run(run.run_id).info.status == "FAILED"
    again = RunLogger.start("resume", run_id=run.run_id, tracking_uri=mlflow_uri)
    assert again.client.get_run(run.run_id).info.status == "RUNNING"
    again.log_metrics(0, {"reward": 0.2})  # a resumed step is re-logged: the last value wins
    again.log_metrics(1, {"reward": 0.3})
    assert again.final_metrics() == {"reward": 0.3}
    again.set_terminated("KILLED")
    assert again.client.get_run(run.run_id).info.status == "KILLED"
    steps, values = metric_histories([run.run_id], "reward", tracking_uri=mlflow_uri)[run.run_id]
    assert steps.tolist() == [0, 1] and values.tolist() == [0.2, 0.3]
    with pytest.raises(RuntimeError, match="closed"):
        again.log_metrics(2, {"reward": 0.4})


def test_trials_frames_and_summaries(mlflow_uri: str, sqlite_url: str) -> None:
    migrate.upgrade(sqlite_url)
    from store import make_engine

    engine = make_engine(sqlite_url)
    parent = RunLogger.start("frames", run_name="study", tracking_uri=mlflow_uri)
    with session_scope(engine) as s:
        study = Study(name="frames", mlflow_run_id=parent.run_id)
        s.add(study)
        s.flush()
        trials = []
        for arm in ("a", "b"):
            for seed in (0, 1):
                with parent.child(f"{arm}-{seed}") as run:
                    run.log_metrics(0, {"reward": seed})
                    run.log_metrics(1, {"reward": seed + (1 if arm == "b" else 0.5)})
                    metrics = run.final_metrics()
                t = Trial(study_id=study.id, arm=arm, seed=seed, mlflow_run_id=run.run_id)
                s.add(t)
                s.flush()
                save_run_summary(s, run.run_id, metrics, trial_id=t.id)
                trials.append(t)
        trials.append(Trial(study_id=study.id, arm="c", seed=0))  # never launched: no run
    parent.set_terminated()

    df = trial_histories_frame(trials, ["reward", "missing"], tracking_uri=mlflow_uri)
    assert list(df.columns) == ["run_id", "key", "step", "value", "timestamp_ms", "arm", "seed", "trial_id"]
    assert len(df) == 8 and set(df.key) == {"reward"}
    means = df[df.step == 1].groupby("arm").value.mean().to_dict()
    assert means == {"a": 1.0, "b": 1.5}
    by_arm = histories_by_arm(trials, "reward", tracking_uri=mlflow_uri)
    assert sorted(by_arm) == ["a", "b"] and len(by_arm["b"]) == 2
    assert by_arm["b"][1][1].tolist() == [1.0, 2.0]
    empty = histories_frame([], "reward", tracking_uri=mlflow_uri)
    assert empty.empty and list(empty.columns)[:4] == ["run_id", "key", "step", "value"]
    from sqlmodel import select

    from store import RunSummary
    from store.db import get_session

    with get_session(engine) as s:
        rows = s.exec(select(RunSummary)).all()
        assert len(rows) == 4 and all(r.trial_id for r in rows)
        again = save_run_summary(s, rows[0].mlflow_run_id, {"reward": 9.0})
        s.commit()
        assert again.id == rows[0].id and again.metrics == {"reward": 9.0}
    engine.dispose()


def test_reward_curves_with_ragged_seeds(tmp_path: Path) -> None:
    curves = {
        "a": [([0, 1, 2, 3], [0.0, 0.1, 0.2, 0.3]), ([0, 2, 4], [0.1, 0.2, 0.5])],
        "b": [(np.arange(5), np.linspace(0, 1, 5))],
        "empty": [([], [])],
    }
    out = reward_curves(curves, tmp_path / "sub" / "r.png", band="minmax")
    assert out.read_bytes()[:4] == b"\x89PNG"
    tmp_png = reward_curves(curves)
    try:
        assert tmp_png.stat().st_size > 1000
    finally:
        tmp_png.unlink()
    with pytest.raises(ValueError):
        reward_curves(curves, tmp_path / "x.png", band="iqr")


def test_full_buffer_is_sent_in_the_background(mlflow_uri: str) -> None:
    run = RunLogger.start("background", tracking_uri=mlflow_uri, flush_size=100, flush_interval_s=60)
    for step in range(250):
        run.log_metrics(step, {"x": step})
    deadline = time.monotonic() + 10
    steps = np.empty(0)
    while time.monotonic() < deadline and len(steps) < 200:
        time.sleep(0.05)
        steps, _ = metric_histories([run.run_id], "x", tracking_uri=mlflow_uri)[run.run_id]
    assert len(steps) >= 200  # kicked by size long before the 60 s interval
    run.set_terminated()
    steps, _ = metric_histories([run.run_id], "x", tracking_uri=mlflow_uri)[run.run_id]
    assert steps.tolist() == list(range(250))


def test_unreachable_store_never_raises_into_training(mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunLogger.start("outage", tracking_uri=mlflow_uri, flush_size=10, flush_interval_s=0.05)
    real = run.client.log_batch
    failures = {"left": 3}

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        if failures["left"] > 0:
            failures["left"] -= 1
            raise ConnectionError("tracking server down")
        return real(*args, **kwargs)

    monkeypatch.setattr(run.client, "log_batch", flaky)
    for step in range(100):
        run.log_metrics(step, {"reward": step / 100})  # must not raise while the store fails
    deadline = time.monotonic() + 15
    while failures["left"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    run.set_terminated()  # sends whatever the background thread has not
    steps, values = metric_histories([run.run_id], "reward", tracking_uri=mlflow_uri)[run.run_id]
    assert steps.tolist() == list(range(100)) and values[-1] == 0.99


def test_a_new_store_is_opened_without_mlflow_announcing_it(tmp_path: Path) -> None:
    """A user's first command printed MLflow's "Creating initial MLflow database tables..." and "Updating
    database tables" (its INFO lines) on stderr, about a store they never asked for."""
    import subprocess
    import sys

    code = "from store.tracking import get_client; get_client()"
    env = {**os.environ, "ROOST_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": ""}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mlflow.db").exists() or list(tmp_path.rglob("mlflow.db")), list(tmp_path.rglob("*"))
    assert "database tables" not in r.stderr, r.stderr
