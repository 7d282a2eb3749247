"""Futures: one model's requests run in the order they were accepted, whatever order they are
fetched in; the SDK's protobuf body is the JSON body's twin; a future of a killed server fails."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from http_wait import wait_answering  # tests/kit, on sys.path
from tinker_kit import TOKEN, TinkerHTTP, datum, fwdbwd, proto_fwdbwd

from store.ports import free_port

pytestmark = pytest.mark.timeout(400)

TOKENS = [5, 17, 42, 9, 33, 8]
TARGETS = [17, 42, 9, 33, 8, 11]


def test_requests_of_one_model_run_in_the_order_accepted(tinker_server: Any) -> None:
    _, t = tinker_server()
    m = t.model(t.session())
    data = [datum(TOKENS, TARGETS)]
    # sent back to back, none waited for: forward, forward_backward, optim_step, forward
    rids = [
        t.ok("forward", fwdbwd(m, data))["request_id"],
        t.ok("forward_backward", fwdbwd(m, data, seq=1))["request_id"],
        t.ok("optim_step", {"model_id": m, "seq_id": 2, "adam_params": {"learning_rate": 2e-2}})["request_id"],
        t.ok("forward", fwdbwd(m, data))["request_id"],
    ]
    after, step, fb, before = (t.result(r) for r in reversed(rids))  # fetched last to first
    assert fb["metrics"]["loss:sum"] == pytest.approx(before["metrics"]["loss:sum"], abs=1e-6)  # before the step
    assert step["metrics"]["grad_norm"] > 0
    assert after["metrics"]["loss:sum"] < before["metrics"]["loss:sum"]  # after it


def test_the_protobuf_body_is_the_json_body(tinker_server: Any) -> None:
    _, t = tinker_server()
    m = t.model(t.session())
    data = [datum(TOKENS, TARGETS, weights=[1.0, 0.5, 0, 1, 1, 2]), datum(TOKENS[:3], TARGETS[:3])]
    as_json = t.call("forward", fwdbwd(m, data))
    raw = proto_fwdbwd(m, data, "cross_entropy", 0, forward_only=True)
    r = t.http.post("/api/v1/forward_backward", content=raw, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.text
    as_proto = t.result(r.json()["request_id"])
    assert as_proto["metrics"]["loss:sum"] == pytest.approx(as_json["metrics"]["loss:sum"], abs=1e-6)
    # the result in protobuf, as the SDK asks for it: starts with the output type's field
    proto = t.http.post(
        "/api/v1/retrieve_future",
        json={"request_id": r.json()["request_id"]},
        headers={"Accept": "application/x-protobuf"},
    )
    assert proto.headers["content-type"].startswith("application/x-protobuf")
    assert proto.content.startswith(b"\x0a\x0bArrayRecord")


def _serve(model_dir: Path, out: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "swarm", "serve", "--engine", "torch", "--device", "cpu", "--model", str(model_dir)]
    cmd += ["--port", str(port), "--token", TOKEN, "--admin-token", "adm", "--lora-rank", "4", "--policy", "main"]
    cmd += ["--out", str(out), "--no-mlflow"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = out.parent / f"{out.name}.log"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        wait_answering(f"http://127.0.0.1:{port}/api/v1/healthz", proc, log, timeout=120, every=0.2)
    except RuntimeError:
        proc.kill()
        proc.wait(10)
        raise
    return proc


def test_kill9_a_saved_state_loads_again_and_the_future_in_flight_fails(model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    proc = _serve(model_dir, tmp_path / "out", port)
    try:
        t = TinkerHTTP(f"http://127.0.0.1:{port}")
        sid = t.session()
        m = t.model(sid)
        data = [datum(TOKENS, TARGETS)]
        t.call("forward_backward", fwdbwd(m, data, seq=1))
        t.call("optim_step", {"model_id": m, "seq_id": 2, "adam_params": {"learning_rate": 5e-2}})
        path = t.call("save_weights", {"model_id": m, "path": "safe", "seq_id": 3})["path"]
        loss = t.call("forward", fwdbwd(m, data))["metrics"]["loss:sum"]
        long = [datum(list(range(1, 400)), list(range(2, 401))) for _ in range(48)]
        rid = t.ok("forward_backward", fwdbwd(m, long, seq=4))["request_id"]  # accepted: in flight
        time.sleep(0.3)  # running (this batch takes seconds on a CPU), never retrieved
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        t.close()
        proc = _serve(model_dir, tmp_path / "out", port)
        t = TinkerHTTP(f"http://127.0.0.1:{port}")
        lost = t.ok("retrieve_future", {"request_id": rid})
        assert lost["category"] == "server" and lost["error"].startswith("future_lost")
        sid2 = t.session()
        body = {"session_id": sid2, "model_seq_id": 0, "path": path, "optimizer": True}
        again = t.call("load_weights", body)
        assert again["model_id"] == f"{sid2}:train:0"
        assert t.call("forward", fwdbwd(again["model_id"], data))["metrics"]["loss:sum"] == pytest.approx(
            loss, abs=1e-5
        )
        t.close()
    finally:
        proc.kill()
        proc.wait(30)


def test_an_id_of_an_earlier_process_is_lost_any_other_unknown_one_is_404(tmp_path: Path) -> None:
    from swarm.tinker.errors import TinkerError
    from swarm.tinker.futures import FutureTable

    ledger = tmp_path / "tinker" / "futures.boots"

    async def issued_by_a_process() -> str:
        return FutureTable(ledger).resolved({"ok": 1})

    earlier = asyncio.run(issued_by_a_process())  # a process that issued an id, then stopped
    now = FutureTable(ledger)  # the restarted one, on the same out dir

    async def outcome(rid: str) -> Any:
        try:
            return await now.wait(rid, 0.01)
        except TinkerError as exc:
            return exc.status, exc.code

    lost = asyncio.run(outcome(earlier))
    assert lost.category == "server" and lost.error.startswith("future_lost")
    never = ["zzz", "0123abcd-1", f"{now.boot}-1", earlier.replace("-1", "-x")]
    assert [asyncio.run(outcome(rid)) for rid in never] == [(404, "future_not_found")] * 4
    assert ledger.read_text().split() == [earlier.split("-")[0]]  # this one has issued nothing yet
