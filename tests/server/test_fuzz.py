"""Schemathesis against the server's own OpenAPI schema: no 5xx, uniform 4xx errors, still healthy after.

Two real loopback servers: the fake engine's, and a torch server of two LoRA policies on one base
(its policy routes and per-policy `model` names live). Every operation of the schema is fuzzed
with positive (schema-valid) and negative (schema-violating) cases, each sent
with the credential its route wants: the worker token for claims and status, a
fresh episode (id in the path, its key as Bearer) for each episode-route case,
a long-lived open episode's key for the OpenAI routes, the admin token for
`/admin/*` (run last; `stop` only with a worker token, which must get 403).
Bounded: MAX_EXAMPLES per operation and mode, derandomized, under a minute each.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
from fuzzing import check_answer, fuzz_operations

schemathesis = pytest.importorskip("schemathesis")

from swarm.config.server import ServerConfig  # noqa: E402
from swarm.engine.fake import FakeEngine  # noqa: E402
from swarm.testing import RunningServer, running_server  # noqa: E402

MAX_EXAMPLES = 15  # per operation and mode: ~60 operations x 2 modes; 25 took 84 s of CI, derandomized either way


FUZZ_CONFIG: dict[str, Any] = dict(
    group_size=2,
    batch_groups=100_000,
    checkpoint_every=0,
    keep_checkpoints=1,
    token="worker-token",
    admin_token="admin-token",
    default_max_tokens=4,
    max_tokens_limit=8,
    max_body_bytes=256 * 1024,
    stop_grace_s=0.1,
    group_stall_s=None,
    lease_seconds=3600,
)  # fuzzing a loaded machine takes > 60 s: the pool's group must not stall, its episode's lease not lapse


@pytest.fixture(params=["fake", "policies"])
def fuzz_server(request: pytest.FixtureRequest, model_dir: Path, tmp_path: Path) -> Iterator[RunningServer]:
    """The fake engine's server, and a real torch server of two LoRA policies on one base, whose
    policy routes (`/swarm/v1/admin/policies`) and per-policy `model` names are live."""
    out = tmp_path / "out"
    if request.param == "fake":
        config = ServerConfig(engine="fake", model_dir=model_dir, out_dir=out, **FUZZ_CONFIG)
        with running_server(config, FakeEngine(model_dir)) as srv:
            yield srv
        return
    from swarm.server.app import make_host  # lazy: torch and peft, only for the policy server

    config = ServerConfig(
        engine="torch",
        device="cpu",
        model_dir=model_dir,
        out_dir=out,
        mlflow=False,
        lora={"rank": 4},
        policies=[{"name": "tiny-model"}, {"name": "other"}],
        **FUZZ_CONFIG,
    )
    with running_server(config, make_host(config)) as srv:
        yield srv


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _claim(srv: RunningServer, task_id: str) -> dict:
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": task_id}, headers=_bearer(srv.token))
    assert r.status_code == 200, r.text
    return r.json()


def _routes_a_policy(op: Any) -> bool:
    """The operations a policy server answers differently: its `model` names, claims of a policy, the
    policy routes. The rest is the same code on both servers, fuzzed on the fake one."""
    path = op.path
    return path.startswith("/v1/") or "/policies" in path or path in ("/swarm/v1/episodes", "/swarm/v1/claims")


def _order(op: Any) -> int:
    return 1 if "/admin/" in op.path else 0  # live config and pause would disturb the others: last


def test_fuzz_every_operation(fuzz_server: RunningServer) -> None:
    srv = fuzz_server
    schema = schemathesis.openapi.from_dict(srv.app.openapi())
    ops = sorted((r.ok() for r in schema.get_all_operations()), key=_order)
    assert len(ops) >= 14
    if srv.app.state.config.policies:
        ops = [op for op in ops if _routes_a_policy(op)]
    session = requests.Session()
    pool = _claim(srv, "fuzz-pool")  # an open episode for the OpenAI routes
    fresh = iter(range(10**6))
    ran: dict[str, int] = {}
    failures: list[str] = []
    statuses: dict[int, int] = {}

    def send(op: Any, case: Any) -> None:
        name = f"{op.method.upper()} {op.path}"
        ran[name] = ran.get(name, 0) + 1
        case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
        if op.path.startswith("/swarm/v1/episodes/"):
            ep = _claim(srv, f"fuzz-ep-{next(fresh)}")
            case.path_parameters = {**(case.path_parameters or {}), "episode_id": ep["episode_id"]}
            token = ep["api_key"]
        elif op.path.startswith("/v1/"):
            token = pool["api_key"]
        elif op.path == "/swarm/v1/admin/stop":
            token = srv.token  # a worker may not stop the server
        elif "/admin/" in op.path:
            token = srv.admin_token
        else:
            token = srv.token
        case.headers["Authorization"] = f"Bearer {token}"
        response = case.call(base_url=srv.url, session=session, timeout=15)
        status = response.status_code
        statuses[status] = statuses.get(status, 0) + 1
        check_answer(name, response, failures, case.as_curl_command())
        if op.path == "/swarm/v1/admin/stop" and status < 400:
            failures.append("a worker token stopped the server")

    started = time.monotonic()
    skipped = fuzz_operations(schemathesis, ops, send, MAX_EXAMPLES, failures)
    elapsed = time.monotonic() - started
    total = sum(ran.values())
    print(
        f"fuzzed {total} cases over {len(ran)} operations in {elapsed:.1f}s "
        f"(no negative cases for {len(skipped)}); statuses {dict(sorted(statuses.items()))}"
    )
    assert not failures, "\n".join(failures[:20])
    assert total >= 10 * len(ops), ran
    assert len(ops) >= 8, [op.path for op in ops]
    assert not srv.swarm.stopping

    # still healthy: health, status, models, and the pool episode still generates and finishes
    httpx.post(f"{srv.url}/swarm/v1/admin/resume", headers=_bearer(srv.admin_token))
    assert httpx.get(f"{srv.url}/health").json()["ok"] is True
    assert httpx.get(f"{srv.url}/swarm/v1/status", headers=_bearer(srv.token)).status_code == 200
    assert httpx.get(f"{srv.url}/v1/models", headers=_bearer(srv.token)).status_code == 200
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_bearer(pool["api_key"]),
        json={"model": "tiny-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{srv.url}/swarm/v1/episodes/{pool['episode_id']}/finish",
        json={"reward": 1.0},
        headers=_bearer(pool["api_key"]),
    )
    assert r.status_code == 200, r.text
    assert srv.swarm.trainer.errors == 0
