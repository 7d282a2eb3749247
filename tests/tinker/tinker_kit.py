"""Helpers of the Tinker API tests (imported by name: conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import time
from typing import Any

TOKEN = "tinker-worker-token"


class TinkerHTTP:
    """Raw calls of the Tinker routes (what the SDK sends, as JSON), and futures waited for."""

    def __init__(self, url: str, key: str = f"tml-{TOKEN}") -> None:
        import httpx  # lazy: only the tests that talk to a server need it

        self.http = httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=60)

    def post(self, route: str, body: dict[str, Any] | None = None, **kw: Any) -> Any:
        return self.http.post(f"/api/v1/{route}", json=body if body is not None else {}, **kw)

    def ok(self, route: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.post(route, body)
        assert r.status_code == 200, r.text
        return r.json()

    def result(self, rid: str, timeout: float = 120) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            out = self.ok("retrieve_future", {"request_id": rid})
            if out.get("type") != "try_again":
                return out
        raise AssertionError(f"future {rid} not done in {timeout}s")

    def call(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.result(self.ok(route, body)["request_id"])

    def session(self) -> str:
        return self.ok("create_session", {"tags": [], "user_metadata": None, "sdk_version": "test"})["session_id"]

    def model(self, sid: str, rank: int = 4, seq: int = 0) -> str:
        body = {"session_id": sid, "model_seq_id": seq, "base_model": BASE, "lora_config": {"rank": rank}}
        return self.call("create_model", body)["model_id"]

    def close(self) -> None:
        self.http.close()


BASE = "tiny-model"


def datum(tokens: list[int], targets: list[int], **inputs: list[float]) -> dict[str, Any]:
    fields = {"target_tokens": {"data": targets, "dtype": "int64", "shape": [len(targets)]}}
    fields.update({k: {"data": v, "dtype": "float32", "shape": [len(v)]} for k, v in inputs.items()})
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]}, "loss_fn_inputs": fields}


def fwdbwd(
    model_id: str, data: list[dict[str, Any]], loss: str = "cross_entropy", seq: int | None = None, **cfg: Any
) -> dict[str, Any]:
    return {
        "model_id": model_id,
        "seq_id": seq,
        "forward_backward_input": {"data": data, "loss_fn": loss, "loss_fn_config": cfg or None},
    }


def sample_body(sampler: str, tokens: list[int], n: int, prompt_logprobs: bool, **params: Any) -> dict[str, Any]:
    """An `asample` request of `n` samples of `tokens` from sampling session `sampler`."""
    return {
        "sampling_session_id": sampler,
        "seq_id": 0,
        "num_samples": n,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
        "sampling_params": params,
        "prompt_logprobs": prompt_logprobs,
    }


# -- the SDK's protobuf form of forward_backward, written independently of swarm/tinker/wire.py -----


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def proto_fwdbwd(model_id: str, data: list[dict[str, Any]], loss: str, seq: int, forward_only: bool = False) -> bytes:
    """`data` as `datum()` makes it, encoded as tinker_public.ForwardBackwardRequest."""
    import numpy as np  # lazy: only the protobuf tests need it

    body = _field(1, model_id.encode()) + _varint(2 << 3) + _varint(seq)
    for d in data:
        tokens = np.asarray(d["model_input"]["chunks"][0]["tokens"], dtype=np.int32).tobytes()
        msg = _field(1, _field(1, _field(1, tokens)))
        for key, t in d["loss_fn_inputs"].items():
            arr = np.asarray(t["data"], dtype=np.int64 if t["dtype"] == "int64" else np.float32)
            dtype = 2 if t["dtype"] == "int64" else 1
            tensor = _field(1, arr.tobytes()) + _varint(3 << 3) + _varint(dtype) + _field(4, _varint(len(arr)))
            msg += _field(2, _field(1, key.encode()) + _field(2, tensor))
        body += _field(3, msg)
    body += _field(4, loss.encode())
    if forward_only:
        body += _varint(6 << 3) + _varint(1)
    return body
