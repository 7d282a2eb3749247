"""The unchanged `tinker` SDK (0.38.0) against a real `swarm serve` on loopback.

`.ci/tinker.sh` runs this file in `.venv-tinker` (tinker, pytest, httpx: no torch, no roost) with
`--noconftest`, and points `ROOST_FULL_PYTHON` at the full install's python, which serves. In the
main test run the SDK is not installed and the file skips, unless `ROOST_REQUIRE_TINKER=1`.
Nothing here imports the project: the server is a separate process, started and killed by the tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import tinker
    from tinker import types
except ImportError:  # the main venv: the SDK is only in .venv-tinker
    if os.environ.get("ROOST_REQUIRE_TINKER") == "1":
        raise
    pytest.skip("the tinker SDK is not installed (bash .ci/tinker.sh runs these tests)", allow_module_level=True)

# ServiceClient.get_server_capabilities() and create_rest_client() are deprecated in 0.38 for
# tinker.RestClient(), whose process-wide holder cache hung here on the second server of a run
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kit"))  # full_install.py, by name
from full_install import free_port, full_python, wait_healthy  # noqa: E402

TOKEN = "sdk-worker-token"
TOKENS = [5, 17, 42, 9, 33, 8]
TARGETS = [17, 42, 9, 33, 8, 11]


class Server:
    """A `swarm serve` process of one LoRA policy on the tiny model; kill -9 and restart in place."""

    def __init__(self, work: Path, engine: str = "torch") -> None:
        self.python = full_python()
        self.work = work
        self.engine = engine
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        model = work / "tiny-model"
        if not (model / "config.json").exists():
            code = f"from swarm.testing import tiny_model_dir; tiny_model_dir({str(work)!r})"
            subprocess.run([self.python, "-c", code], check=True, capture_output=True, timeout=300)
        self.model = model

    def start(self) -> None:
        env = {**os.environ, "ROOST_HOME": str(self.work / "home"), "HF_HUB_OFFLINE": "1"}
        cmd = [self.python, "-m", "swarm", "serve", "--engine", self.engine, "--device", "cpu"]
        cmd += ["--model", str(self.model), "--port", str(self.port), "--token", TOKEN, "--admin-token", "sdk-admin"]
        cmd += ["--lora-rank", "4", "--policy", "main", "--out", str(self.work / "server"), "--no-mlflow"]
        log = open(self.work / "server.log", "ab")  # noqa: SIM115 - the child writes it; closed on stop
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        wait_healthy(self.proc, self.url, self.work / "server.log", timeout=120 if self.engine == "torch" else 600)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Server]:
    srv = Server(tmp_path, getattr(request, "param", "torch"))
    srv.start()
    monkeypatch.setenv("TINKER_BASE_URL", srv.url)
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{TOKEN}")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)


def _datum(tokens: list[int] = TOKENS, targets: list[int] = TARGETS, **inputs: list[float]) -> Any:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs={"target_tokens": targets, **inputs}
    )


def _training(service: Any, rank: int = 4) -> Any:
    base = service.get_server_capabilities().supported_models[0].model_name
    return service.create_lora_training_client(base_model=base, rank=rank).result()


@pytest.mark.timeout(300)
def test_training_client_forward_backward_and_optim_step(server: Server) -> None:
    service = tinker.ServiceClient()
    caps = service.get_server_capabilities()
    assert caps.supported_models[0].model_name == "tiny-model" and caps.supported_models[0].trainable
    tc = _training(service)
    tokenizer = tc.get_tokenizer()  # the server's model directory, loaded from its path: no hub (it tried one)
    assert tokenizer.decode(tokenizer.encode("What is 2+3?")) == "What is 2+3?"
    data = [_datum(weights=[1.0] * 6)]
    first = tc.forward_backward(data, "cross_entropy").result()
    lp = first.loss_fn_outputs[0]["logprobs"].tolist()
    assert len(lp) == 6 and first.metrics["loss:sum"] == pytest.approx(-sum(lp), rel=1e-5)
    step = tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert step.metrics is not None and step.metrics["grad_norm"] > 0
    after = tc.forward(data, "cross_entropy").result()
    assert after.metrics["loss:sum"] < first.metrics["loss:sum"]
    # the RL losses run through the same client (ppo with its clip thresholds from loss_fn_config)
    rl = [_datum(logprobs=lp, advantages=[0.5] * 6)]
    out = tc.forward_backward(rl, "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).result()
    assert out.metrics["loss:sum"] != 0
    for loss in ("importance_sampling", "cispo", "dro"):
        assert tc.forward(rl, loss).result().loss_fn_outputs[0]["logprobs"].shape == [6]


@pytest.mark.timeout(300)
def test_sample_and_compute_logprobs_from_a_saved_sampler(server: Server) -> None:
    service = tinker.ServiceClient()
    tc = _training(service)
    sampler = tc.save_weights_and_get_sampling_client().result()
    # its tokenizer from the base model it was told, the model directory's path: no hub (the served name was)
    assert sampler.get_tokenizer().encode("What is 2+3?") == tc.get_tokenizer().encode("What is 2+3?")
    params = types.SamplingParams(max_tokens=5, seed=3, temperature=1.0)
    res = sampler.sample(types.ModelInput.from_ints(TOKENS), num_samples=3, sampling_params=params).result()
    assert len(res.sequences) == 3
    for seq in res.sequences:
        assert 1 <= len(seq.tokens) <= 5 and len(seq.logprobs) == len(seq.tokens)
    lp = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    fwd = tc.forward([_datum(TOKENS[:-1], TOKENS[1:])], "cross_entropy").result()
    assert lp[0] is None
    assert lp[1:] == pytest.approx(fwd.loss_fn_outputs[0]["logprobs"].tolist(), abs=1e-5)
    # a named snapshot, sampled by path from a new sampling client, with top-k logprobs
    path = tc.save_weights_for_sampler("named").result().path
    assert path.endswith("/sampler_weights/named")
    by_path = service.create_sampling_client(model_path=path)
    assert by_path.get_tokenizer().decode(by_path.get_tokenizer().encode("2+3")) == "2+3"  # the base it was told
    res = by_path.sample(
        types.ModelInput.from_ints(TOKENS),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=3, seed=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=2,
        topk_sample_logprobs=2,
        prompt_logprobs_last_n=2,
    ).result()
    assert res.prompt_logprobs[:-2] == [None] * (len(TOKENS) - 2)
    assert res.prompt_logprobs[-2:] == pytest.approx(lp[-2:], abs=1e-5)
    top = res.topk_prompt_logprobs
    assert top[0] is None and len(top[-1]) == 2 and top[-1][0][1] >= top[-1][1][1]
    seq = res.sequences[0]
    assert len(seq.topk_logprobs) == len(seq.tokens) and all(len(row) == 2 for row in seq.topk_logprobs)
    assert seq.topk_logprobs[0][0][1] >= seq.logprobs[0] - 1e-6  # the top token is at least as likely


@pytest.mark.timeout(300)
def test_save_state_and_load_it_into_a_new_client(server: Server) -> None:
    service = tinker.ServiceClient()
    tc = _training(service)
    data = [_datum()]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    path = tc.save_state("after-one").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/after-one")
    trained = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    again = service.create_training_client_from_state_with_optimizer(path).result()
    assert again.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(trained, abs=1e-5)
    listed = service.create_rest_client().list_checkpoints(tc.model_id).result().checkpoints
    assert path in [c.tinker_path for c in listed]


@pytest.mark.timeout(400)
def test_kill9_saved_state_survives_and_the_future_in_flight_fails(server: Server) -> None:
    service = tinker.ServiceClient()
    tc = _training(service)
    data = [_datum()]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    path = tc.save_state("durable").result().path
    before = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    long = [_datum(list(range(1, 400)), list(range(2, 401))) for _ in range(48)]
    in_flight = tc.forward_backward(long, "cross_entropy")
    time.sleep(1.0)  # accepted and running (the batch takes seconds on a CPU)
    server.kill9()
    server.start()  # same port, same out dir
    with pytest.raises(Exception) as err:
        in_flight.result(timeout=240)
    print("in-flight future failed with:", err.value)
    assert "future_lost" in str(err.value)  # accepted before the kill: the SDK surfaces the loss
    fresh = tinker.ServiceClient()
    loaded = fresh.create_training_client_from_state(path).result()
    assert loaded.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(before, abs=1e-5)


@pytest.mark.timeout(120)
def test_a_key_without_the_worker_token_is_refused(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-not-the-token")
    with pytest.raises(Exception) as err:
        tinker.ServiceClient().create_lora_training_client(base_model="tiny-model", rank=4).result(timeout=60)
    assert "401" in str(err.value) or "invalid" in str(err.value).lower()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("server", ["vllm"], indirect=True)
def test_on_a_vllm_server_the_sdk_trains_and_vllm_samples(server: Server) -> None:
    """`swarm serve --engine vllm`: the primitives train on the server's torch host, each optim_step's
    adapter reaches vLLM, and a sampler's samples come from vLLM with the trained model's logprobs."""
    service = tinker.ServiceClient()
    tc = _training(service)
    data = [_datum(weights=[1.0] * 6)]
    first = tc.forward_backward(data, "cross_entropy").result()
    step = tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert step.metrics is not None and "publish_s" in step.metrics and "publish_failed" not in step.metrics
    assert tc.forward(data, "cross_entropy").result().metrics["loss:sum"] < first.metrics["loss:sum"]
    sampler = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=4, seed=3, temperature=1.0)
    res = sampler.sample(types.ModelInput.from_ints(TOKENS), num_samples=2, sampling_params=params).result()
    for seq in res.sequences:  # vLLM's logprobs of its samples: the trained model's (CPU kernels: 0.05)
        full = TOKENS + list(seq.tokens)
        fwd = tc.forward([_datum(full[:-1], full[1:])], "cross_entropy").result()
        expected = fwd.loss_fn_outputs[0]["logprobs"].tolist()[-len(seq.tokens) :]
        assert max(abs(a - b) for a, b in zip(seq.logprobs, expected)) <= 0.05
    base = service.get_server_capabilities().supported_models[0].model_name
    on_base = service.create_sampling_client(base_model=base)
    out = on_base.sample(types.ModelInput.from_ints(TOKENS), num_samples=1, sampling_params=params).result()
    assert 1 <= len(out.sequences[0].tokens) <= 4
