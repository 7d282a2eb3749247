"""What `swarm train` prints and logs around the training itself: what it is doing, and no library noise.

One short run (2 steps, MLflow on) serves every test here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from train_runs import SMALL, swarm_train  # tests/kit, on sys.path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: what transformers, torch and urllib3 used to write into a server's log: progress bars without a
#: terminal, the deprecated KV-cache argument, the SOCKS warning of a racing `import requests`
SERVER_NOISE = ("Loading weights", "Writing model shards", "past_key_values", "FutureWarning", "SOCKS support")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    tmp = tmp_path_factory.mktemp("train-output")
    r, out = swarm_train(tmp, *SMALL, timeout=400)
    return r, out


def test_server_log_holds_no_library_noise(trained: tuple[subprocess.CompletedProcess, Path]) -> None:
    _, out = trained
    log = (out / "logs" / "server.log").read_text()
    assert "step 2" in log  # the log of a server that trained
    found = [noise for noise in SERVER_NOISE if noise in log]
    assert not found, log


def test_logging_the_model_says_so_and_asks_no_hub(trained: tuple[subprocess.CompletedProcess, Path]) -> None:
    r, out = trained
    assert "could not be retrieved from the hub" not in r.stderr, r.stderr
    assert "Writing model shards" not in r.stderr and "Loading weights" not in r.stderr, r.stderr
    assert "logged the trained model to MLflow" in r.stderr, r.stderr
    import mlflow.artifacts  # lazy: MLflow takes seconds to import; only this test reads it
    from mlflow import MlflowClient  # lazy: as above

    tracked = json.loads((out / "summary.json").read_text())["mlflow"]
    logged = MlflowClient(tracked["tracking_uri"]).get_logged_model(tracked["model_uri"].split("/")[-1])
    card = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"{logged.artifact_location}/model_card.md", dst_path=str(out / "card")
        )
    )
    assert "swarm train" in card.read_text()  # the card written here, not one looked up on the Hub
    # the server logged it, with torch, transformers and MLflow loaded already, in the run's experiment
    assert "logged the trained model to MLflow" in (out / "logs" / "server.log").read_text()
    run = MlflowClient(tracked["tracking_uri"]).get_run(tracked["run_id"])
    assert logged.source_run_id == run.info.run_id and logged.experiment_id == run.info.experiment_id
