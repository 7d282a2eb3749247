"""The server logs the trained model to its MLflow run as it closes the run after `max_steps`.

`swarm train` used to do it in its own process after the server exited, importing torch, transformers
and MLflow for it (~15 s of a 3-step run); the server has them loaded, so the sink does it in ~1 s.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from swarm.server.tracking import EXTRA_FILE, MODEL_FILE, RUN_FILE, MlflowSink

pytestmark = pytest.mark.slow  # MLflow, torch and transformers imported, a SQLite store created


def _sink(out: Path, uri: str, final_step: int | None, base: Path) -> MlflowSink:
    return MlflowSink(
        out,
        "final-model",
        "run",
        {"engine": "torch", "group_size": 1},
        tracking_uri=uri,
        final_step=final_step,
        base_model=base,
    )


def test_the_model_is_logged_at_a_close_after_the_final_step(tmp_path: Path, model_dir: Path) -> None:
    import mlflow  # lazy: MLflow takes seconds to import; only these tests read it
    import mlflow.artifacts  # lazy: as above

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "server"
    out.mkdir()
    checkpoint = tmp_path / "checkpoints" / "step_000003"
    shutil.copytree(model_dir, checkpoint)
    (tmp_path / "run.yaml").write_text("task: arith\n")
    (out / EXTRA_FILE).write_text(
        json.dumps(
            {
                "params": {"task": "arith", "group_size": "8"},
                "artifacts": [str(tmp_path / "run.yaml")],
                "model_card": {"title": "run: trained by `swarm train`", "description": "the card's words"},
            }
        )
    )
    sink = _sink(out, uri, 3, model_dir)
    sink.checkpoint(2, checkpoint.parent / "step_000002")  # an earlier checkpoint: not the final model
    sink.checkpoint(3, checkpoint)
    sink.close()

    state = json.loads((out / MODEL_FILE).read_text())
    assert state["state"] == "logged" and state["seconds"] >= 0, state
    client = mlflow.MlflowClient(uri)
    run = client.get_run(json.loads((out / RUN_FILE).read_text())["run_id"])
    assert run.info.status == "FINISHED" and state["run_id"] == run.info.run_id
    assert run.data.params["task"] == "arith"  # the starter's params are logged with the server's,
    assert run.data.params["group_size"] == "1"  # which win a clash
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["run.yaml"]
    logged = client.get_logged_model(state["model_uri"].split("/")[-1])
    # in the run's experiment (without the run active, MLflow puts it in Default, under the working directory)
    assert logged.source_run_id == run.info.run_id and logged.experiment_id == run.info.experiment_id
    card = mlflow.artifacts.download_artifacts(
        artifact_uri=f"{logged.artifact_location}/model_card.md", dst_path=str(tmp_path / "card")
    )
    assert "run: trained by `swarm train`" in Path(card).read_text()
    assert not mlflow.tracking.is_tracking_uri_set()  # the global URI it needed is put back
    from mlflow.utils import environment  # lazy: as above

    assert environment.warn_dependency_requirement_mismatches.__name__ == "warn_dependency_requirement_mismatches"


def test_no_model_before_the_final_step_and_a_failure_is_only_reported(tmp_path: Path, model_dir: Path) -> None:
    import mlflow  # lazy: MLflow takes seconds to import; only these tests read it

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    early = tmp_path / "early"
    sink = _sink(early, uri, 3, model_dir)
    sink.checkpoint(2, model_dir)  # stopped (Ctrl-C, SIGTERM) before max_steps: no final model
    sink.close()
    assert not (early / MODEL_FILE).exists()
    run_id = json.loads((early / RUN_FILE).read_text())["run_id"]
    assert mlflow.MlflowClient(uri).get_run(run_id).info.status == "FINISHED"

    broken = tmp_path / "broken"
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    weightless = tmp_path / "weightless"  # the fake engine's: a config and a tokenizer, no weights
    sink = _sink(weightless, uri, 3, model_dir)
    sink.checkpoint(3, checkpoint)
    sink.close()
    assert not (weightless / MODEL_FILE).exists()  # nothing to log, nothing said (it read "could not log")
    (checkpoint / "model.safetensors").write_bytes(b"not weights")  # not a model transformers can load
    sink = _sink(broken, uri, 3, model_dir)
    sink.checkpoint(3, checkpoint)
    sink.close()
    state = json.loads((broken / MODEL_FILE).read_text())
    assert state["state"] == "failed" and state["error"], state
    run_id = json.loads((broken / RUN_FILE).read_text())["run_id"]
    assert mlflow.MlflowClient(uri).get_run(run_id).info.status == "FINISHED"  # the run itself is fine
