"""A real `mlflow server` on loopback: runs logged over HTTP read back the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from store import RunLogger, histories_frame, metric_histories, reward_curves
from store.testing import MlflowServer


@pytest.mark.slow
@pytest.mark.integration
def test_log_to_mlflow_server_over_http(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    uri = mlflow_server.uri
    parent = RunLogger.start("http-study", run_name="study", tracking_uri=uri)
    logged: dict[str, list[float]] = {}
    for seed in range(2):
        with parent.child(f"arm-a s{seed}", tags={"roost.arm": "a"}) as run:
            run.log_params({"seed": seed, "engine": "torch"})
            values = [float(np.sin(step / 50) + seed) for step in range(300)]
            for step, v in enumerate(values):
                run.log_metrics(step, {"reward": v, "tokens": step * 10})
            logged[run.run_id] = values
    hist = metric_histories(list(logged), "reward", tracking_uri=uri)
    png = reward_curves({"a": list(hist.values())}, tmp_path / "reward.png")
    parent.log_artifact(png, "plots")
    parent.log_samples(0, [{"ids": [1, 2, 3]}])
    parent.set_terminated()

    client = parent.client
    for run_id, values in logged.items():
        steps, got = hist[run_id]
        assert steps.tolist() == list(range(300))
        assert np.allclose(got, values)
        run = client.get_run(run_id)
        assert run.data.tags[MLFLOW_PARENT_RUN_ID] == parent.run_id
        assert run.data.params["seed"] in {"0", "1"}
        assert run.info.status == "FINISHED"
    df = histories_frame(list(logged), ["reward", "tokens"], tracking_uri=uri)
    assert len(df) == 2 * 2 * 300
    arts = {a.path for a in client.list_artifacts(parent.run_id, "plots")}
    assert arts == {"plots/reward.png"}
    got_png = Path(client.download_artifacts(parent.run_id, "plots/reward.png", str(tmp_path / "dl")))
    assert got_png.read_bytes() == png.read_bytes()
    # proxied over HTTP into the server's destination; no local artifact root was used
    assert list((mlflow_server.workdir / "artifacts").rglob("reward.png"))
    assert not list(tmp_path.rglob("mlartifacts"))
