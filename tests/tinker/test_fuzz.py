"""Schemathesis against the Tinker routes of a real torch policy server: no 5xx, uniform 4xx, and no
future that fails as the server's fault.

The routes read their bodies themselves (JSON or the SDK's protobuf), so the server's OpenAPI schema
has no request bodies for them; this test builds one from the same pydantic models the routes parse
with (swarm/tinker/schema.py). Each case is sent with the worker key, and with the ids of a live
session, model and sampler in place of generated ones most of the time, so cases get past the
lookups into validation and the model's lane. Every future a case starts is waited for: a failure
must be the caller's (`category: user`), never `server`, which is what an unexpected exception
inside the work reports. Bounded: MAX_EXAMPLES per operation and mode, derandomized.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import requests
from fuzzing import check_answer, fuzz_operations
from pydantic import BaseModel
from tinker_kit import BASE, TOKEN, datum, fwdbwd

from swarm.tinker import schema as s

schemathesis = pytest.importorskip("schemathesis")

pytestmark = pytest.mark.timeout(600)

MAX_EXAMPLES = 12
BODIES: dict[str, type[BaseModel]] = {
    "/api/v1/create_session": s.CreateSession,
    "/api/v1/session_heartbeat": s.SessionRef,
    "/api/v1/create_model": s.CreateModel,
    "/api/v1/get_info": s.ModelRef,
    "/api/v1/forward_backward": s.ForwardBackwardBody,
    "/api/v1/forward": s.ForwardBackwardBody,
    "/api/v1/optim_step": s.OptimStep,
    "/api/v1/save_weights": s.SaveWeights,
    "/api/v1/save_weights_for_sampler": s.SaveWeights,
    "/api/v1/load_weights": s.LoadWeights,
    "/api/v1/create_sampling_session": s.CreateSamplingSession,
    "/api/v1/asample": s.Sample,
    "/api/v1/retrieve_future": s.RetrieveFuture,
}
GETS = ("/api/v1/training_runs/{model_id}/checkpoints", "/api/v1/samplers/{sampler_id}")


def _schema() -> dict[str, Any]:
    """An OpenAPI document of the Tinker routes with their request bodies, from the routes' models."""
    components: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    ok = {"200": {"description": "ok"}}
    for path, model in BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        content = {"application/json": {"schema": ref}}
        paths[path] = {"post": {"requestBody": {"required": True, "content": content}, "responses": ok}}
    for path in GETS:
        name = path.rsplit("{", 1)[1].rstrip("}")
        param = {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        paths[path] = {"get": {"parameters": [param], "responses": ok}}
    info = {"title": "tinker", "version": "1"}
    return {"openapi": "3.0.3", "info": info, "paths": paths, "components": {"schemas": components}}


def _live_ids(body: Any, ids: dict[str, str], rng: random.Random) -> Any:
    """`body` with its id fields set to live ones 4 times in 5 (the fifth keeps what was generated)."""
    if not isinstance(body, dict):
        return body
    out = dict(body)
    for key, value in ids.items():
        if key in out and rng.random() < 0.8:
            out[key] = value
    return out


def test_fuzz_tinker_routes(tinker_server: Any) -> None:
    _, t = tinker_server()
    sid = t.session()
    model_id = t.model(sid)
    t.call("forward_backward", fwdbwd(model_id, [datum([5, 17, 42], [17, 42, 9])]))
    saved = t.call("save_weights_for_sampler", {"model_id": model_id, "path": "fuzz-0", "sampling_session_seq_id": 0})
    ids = {
        "session_id": sid,
        "model_id": model_id,
        "sampling_session_id": saved["sampling_session_id"],
        "sampler_id": saved["sampling_session_id"],
        "base_model": BASE,
        "model_path": saved["path"],
    }
    schema = schemathesis.openapi.from_dict(_schema())
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) == len(BODIES) + len(GETS)
    session = requests.Session()
    rng = random.Random(0)
    failures: list[str] = []
    futures: list[tuple[str, str]] = []
    statuses: dict[int, int] = {}
    ran: dict[str, int] = {}

    def send(op: Any, case: Any) -> None:
        name = f"{op.method.upper()} {op.path}"
        ran[name] = ran.get(name, 0) + 1
        case.headers = {"X-API-Key": f"tml-{TOKEN}"}
        if case.path_parameters:
            case.path_parameters = _live_ids(case.path_parameters, ids, rng)
        if op.path.endswith("/retrieve_future") and futures and isinstance(case.body, dict) and rng.random() < 0.5:
            case.body = {**case.body, "request_id": futures[-1][1]}
        elif not op.path.endswith("/retrieve_future"):
            case.body = _live_ids(case.body, ids, rng)
        response = case.call(base_url=str(t.http.base_url).rstrip("/"), session=session, timeout=60)
        status = response.status_code
        statuses[status] = statuses.get(status, 0) + 1
        check_answer(name, response, failures, str(case.body), code=True)
        if status < 400:
            out = response.json()
            if isinstance(out, dict) and isinstance(out.get("request_id"), str) and "retrieve" not in op.path:
                futures.append((f"{name} {str(case.body)[:400]}", out["request_id"]))

    started = time.monotonic()
    fuzz_operations(schemathesis, ops, send, MAX_EXAMPLES, failures)
    for what, rid in futures:
        out = t.result(rid)
        if "error" in out and out.get("category") != "user":
            failures.append(f"future of {what}: {out}")
    print(
        f"fuzzed {sum(ran.values())} cases over {len(ran)} operations and waited for {len(futures)} futures "
        f"in {time.monotonic() - started:.1f}s; statuses {dict(sorted(statuses.items()))}"
    )
    assert not failures, "\n".join(failures[:20])
    assert sum(ran.values()) >= 5 * len(ops), ran

    # still serving: the model trains and samples as before
    out = t.call("forward_backward", fwdbwd(model_id, [datum([5, 17, 42], [17, 42, 9])]))
    assert "loss:sum" in out["metrics"]
