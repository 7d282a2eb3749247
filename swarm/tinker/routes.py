"""The Tinker REST routes (`/api/v1/...`) as the unchanged tinker 0.38 SDK calls them.

    TINKER_BASE_URL=http://127.0.0.1:8000  TINKER_API_KEY=tml-<worker token>   (docs/tinker.md)

Every route takes the worker (or admin) token, as `X-API-Key` (the SDK's header; `tml-` before
the token, which the SDK demands, is dropped) or as a Bearer token, and checks it before it reads
the body. A request the server can judge wrong from its body (an unknown loss, inputs of different
lengths, NaN advantages, a negative lr, a path never saved, a second client's seq_id) is refused
with 4xx and a stable `error.code` before anything is queued, so nothing of it is applied.
Training requests answer a future at once (`{"request_id": ...}`) and run in the model's lane;
`retrieve_future` waits up to `POLL_S` for one and then tells the SDK to ask again.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from swarm.tinker import schema as s
from swarm.tinker.errors import TinkerError
from swarm.tinker.futures import Outcome
from swarm.tinker.validate import PROTO, check_adam, datums_of, parse_body, parse_fwdbwd, sampling_params
from swarm.tinker.wire import MASK_LOGPROB, WireSequence, topk_arrays
from swarm.tinker.wire import encode_forward_backward_output as encode_fb
from swarm.tinker.wire import encode_sample_response as encode_sample

if TYPE_CHECKING:
    from swarm.tinker.service import TinkerService

PREFIX = "/api/v1"
POLL_S = 20.0  # one retrieve_future waits this long at most (the SDK's own timeout is 45 s)

router = APIRouter(prefix=PREFIX, tags=["tinker"])


def _error(status: int, code: str, message: str) -> JSONResponse:
    kind = {401: "authentication_error", 404: "not_found_error", 409: "conflict_error", 410: "gone_error"}
    body = {"error": {"message": message, "type": kind.get(status, "invalid_request_error"), "code": code}}
    return JSONResponse(body, status_code=status)


def service(request: Request) -> TinkerService:
    svc = getattr(request.app.state, "tinker", None)
    if svc is None:
        raise TinkerError(
            409,
            "not_a_policy_server",
            "the Tinker API trains LoRA policies on a shared base: start swarm serve with --policy NAME "
            "and --lora-rank r (the torch or vllm engine)",
        )
    return svc


async def caller(
    request: Request, x_api_key: str | None = Header(None), authorization: str | None = Header(None)
) -> TinkerService:
    """The worker or admin token as the SDK's API key (`tml-TOKEN`, or a token that starts with `tml-`)."""
    cfg = request.app.state.config
    given = x_api_key or (authorization[7:].strip() if authorization and authorization.startswith("Bearer ") else "")
    if not given:
        raise TinkerError(401, "missing_api_key", "missing API key: set TINKER_API_KEY=tml-<worker token>")
    candidates = {given, given.removeprefix("tml-")}
    tokens = [t for t in (cfg.token, cfg.admin_token) if t]
    if not any(hmac.compare_digest(c.encode(), t.encode()) for c in candidates for t in tokens):
        raise TinkerError(401, "invalid_token", "invalid API key (TINKER_API_KEY=tml-<worker token>)")
    return service(request)


async def body_of(request: Request, model: type[BaseModel]) -> Any:
    return parse_body(await request.body(), model)


def fingerprint(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def future(rid: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"request_id": rid, "model_id": model_id, **extra}


# -- the service's own routes ------------------------------------------------------


@router.post("/client/config")
async def client_config(_: TinkerService = Depends(caller)) -> dict[str, Any]:
    """The SDK's feature flags for this server: API keys (no JWT exchange), plain httpx, serial
    forward_backward chunks, futures polled one by one, custom losses on the client."""
    return {
        "pjwt_auth_enabled": False,
        "use_pyqwest_transport": False,
        "parallel_fwdbwd_chunks": False,
        "proto_compress_fwdbwd": False,
        "sample_use_retrieve_futures": False,
        "custom_loss_server_side": False,
        "sample_join_sampling_session": False,
    }


@router.post("/client/dynamic_config")
async def dynamic_config(_: TinkerService = Depends(caller)) -> dict[str, Any]:
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/telemetry")
async def telemetry(_: TinkerService = Depends(caller)) -> dict[str, str]:
    return {"status": "accepted"}  # the SDK's telemetry is not kept


@router.post("/cancel_future")
async def cancel_future(_: TinkerService = Depends(caller)) -> dict[str, Any]:
    return {}  # a sample runs to its end; its result is dropped unread


@router.get("/get_server_capabilities")
async def capabilities(svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    return {
        "supported_models": [
            {
                "model_name": svc.base_names[0],
                "max_context_length": svc.max_context,
                "trainable": True,
                "sampleable": True,
            }
        ]
    }


@router.post("/create_session")
async def create_session(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    await body_of(request, s.CreateSession)
    return {"type": "create_session", "session_id": svc.create_session()}


@router.post("/session_heartbeat")
async def heartbeat(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    body = await body_of(request, s.SessionRef)
    svc.session(body.session_id)
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    await svc.finish_session(session_id)  # its models' adapters are freed; their saves stay on disk (404 unknown)
    return {}


# -- models ---------------------------------------------------------------------------


@router.post("/create_model")
async def create_model(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    body = await body_of(request, s.CreateModel)
    rank = body.lora_config.rank if body.lora_config is not None else 32
    m = await svc.create_model(body.session_id, body.model_seq_id, body.base_model, rank)
    return future(svc.futures.resolved({"model_id": m.id, "type": "create_model"}), m.id)


@router.post("/get_info")
async def get_info(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    body = await body_of(request, s.ModelRef)
    m = svc.model(body.model_id)
    base = svc.base_names[0]
    return {
        "type": "get_info",
        "model_id": m.id,
        # model_data.model_name is what the SDK gives the samplers this client makes as their base model, and
        # a sampler's get_tokenizer() loads that name (no tokenizer_id there): the directory, not the hub
        "model_data": {"arch": "causal_lm", "model_name": svc.tokenizer_id, "tokenizer_id": svc.tokenizer_id},
        "is_lora": True,
        "lora_rank": m.rank,
        "model_name": base,
    }


async def _fwdbwd(request: Request, svc: TinkerService, forward_only: bool | None) -> dict[str, Any]:
    from swarm.tinker.compute import forward_backward  # lazy: torch

    raw = await request.body()
    req = parse_fwdbwd(raw, request.headers.get("content-type", ""))
    only = req.forward_only if forward_only is None else forward_only
    m = svc.model(req.model_id)
    datums, config = datums_of(svc, req)

    def work() -> Outcome:
        outs, metrics = forward_backward(m.policy, datums, req.loss_fn, config, m.stash, forward_only=only)
        as_json = {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": [
                {k: {"data": v.tolist(), "dtype": "float32", "shape": [len(v)]} for k, v in o.items()} for o in outs
            ],
            "metrics": metrics,
        }
        return Outcome(json=as_json, proto=encode_fb(outs, metrics))

    return future(svc.submit(m, req.seq_id or None, fingerprint(raw), work), m.id)


@router.post("/forward_backward")
async def forward_backward(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    return await _fwdbwd(request, svc, None)


@router.post("/forward")
async def forward(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    return await _fwdbwd(request, svc, True)


@router.post("/optim_step")
async def optim_step(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    from swarm.tinker.compute import AdamStep  # lazy: torch
    from swarm.tinker.compute import optim_step as step_fn

    raw = await request.body()
    body = await body_of(request, s.OptimStep)
    if body.optimizer_params is not None:
        raise TinkerError(400, "unsupported_optimizer", "only Adam (AdamParams) is supported")
    p = check_adam(body.adam_params or body.optim_params or s.AdamParamsBody())
    m = svc.model(body.model_id)
    step = AdamStep(p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm)

    def work() -> dict[str, Any]:
        metrics = step_fn(m.policy, step, m.stash)
        return {"metrics": {**metrics, **svc.published(m)}}

    return future(svc.submit(m, body.seq_id, fingerprint(raw), work), m.id)


# -- checkpoints --------------------------------------------------------------------


def _name(svc: TinkerService, name: str) -> str:
    from swarm.tinker.checkpoints import PathError, check_name  # lazy: torch

    try:
        return check_name(name)
    except PathError as exc:
        raise TinkerError(400, exc.code, exc.message) from None


@router.post("/save_weights")
async def save_weights(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    raw = await request.body()
    body = await body_of(request, s.SaveWeights)
    m = svc.model(body.model_id)
    name = _name(svc, body.path or f"step-{body.seq_id or 0}")
    rid = svc.submit(
        m, body.seq_id, fingerprint(raw), lambda: {"path": svc.save(m, "weights", name).uri, "type": "save_weights"}
    )
    return future(rid, m.id)


@router.post("/save_weights_for_sampler")
async def save_for_sampler(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    from swarm.tinker.checkpoints import TinkerPath  # lazy: torch

    raw = await request.body()
    body = await body_of(request, s.SaveWeights)
    m = svc.model(body.model_id)
    name = _name(svc, body.path or f"sampler-{body.seq_id or 0}")
    svc.snapshot_name(TinkerPath(m.id, "sampler_weights", name))  # 400 before anything when too long
    sampler_seq = body.sampling_session_seq_id

    async def work() -> dict[str, Any]:
        path = await asyncio.to_thread(svc.save, m, "sampler_weights", name)
        await svc.snapshot(path)  # published: served under its model name from here on
        out: dict[str, Any] = {"path": path.uri, "type": "save_weights_for_sampler"}
        if sampler_seq is not None:
            out["sampling_session_id"] = svc.create_sampler(m.session.id, 10_000 + sampler_seq, None, path.uri)
        return out

    return future(svc.submit(m, body.seq_id, fingerprint(raw), work, thread=False), m.id)


@router.post("/load_weights")
async def load_weights(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    from swarm.tinker.checkpoints import load, read_meta  # lazy: torch

    raw = await request.body()
    body = await body_of(request, s.LoadWeights)
    path, folder = svc.folder(body.path)
    if body.model_id is None:  # create-via-load: a new model of the checkpoint's rank, then the load
        if body.session_id is None or body.model_seq_id is None:
            raise TinkerError(400, "invalid_request", "load_weights needs model_id, or session_id and model_seq_id")
        rank = int(read_meta(folder).get("rank", 0))
        m = await svc.create_model(body.session_id, body.model_seq_id, svc.base_names[0], rank)
        seq = None
    else:
        m = svc.model(body.model_id)
        seq = body.seq_id
    svc.check_rank(m, folder)

    def work() -> dict[str, Any]:
        load(m.policy, folder, body.optimizer)
        m.stash.clear()
        svc.hooks.publish(m.policy.name)  # served as loaded (vLLM: its adapter), or the future fails saying why
        return {"path": path.uri, "model_id": m.id, "type": "load_weights"}

    return future(svc.submit(m, seq, fingerprint(raw), work), m.id)


@router.get("/training_runs/{model_id}/checkpoints")
async def list_checkpoints(model_id: str, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    from swarm.tinker.checkpoints import listing  # lazy: torch

    return {"checkpoints": listing(svc.root, svc.training_run(model_id)), "cursor": None}


# -- sampling -------------------------------------------------------------------------


@router.post("/create_sampling_session")
async def create_sampling_session(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    body = await body_of(request, s.CreateSamplingSession)
    sid = svc.create_sampler(body.session_id, body.sampling_session_seq_id, body.base_model, body.model_path)
    return {"type": "create_sampling_session", "sampling_session_id": sid}


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    path = svc.sampler_path(sampler_id, None)
    # the model directory's path, a base model name the server accepts: the SDK's sampler loads its tokenizer
    # from it (SamplingClient.get_tokenizer() takes this name to AutoTokenizer; the served name meant the hub)
    return {"sampler_id": sampler_id, "base_model": svc.tokenizer_id, "model_path": path.uri if path else None}


@router.post("/asample")
async def asample(request: Request, svc: TinkerService = Depends(caller)) -> dict[str, Any]:
    body = await body_of(request, s.Sample)
    if not (body.sampling_session_id or body.model_path or body.base_model):  # it sampled the base, unasked
        raise TinkerError(400, "invalid_request", "asample needs sampling_session_id, model_path or base_model")
    path = svc.sampler_path(body.sampling_session_id, body.model_path)  # 404 before anything is queued
    if path is None and body.sampling_session_id is None:
        svc.check_base(body.base_model or svc.base_names[0])
    ids, params = sampling_params(svc, body)
    topk = body.topk_prompt_logprobs if (body.prompt_logprobs or body.topk_prompt_logprobs) else None

    k, last_n = body.topk_sample_logprobs, body.prompt_logprobs_last_n

    async def work() -> Outcome:
        outs, prompt = await svc.sample(path, ids, params, body.num_samples, topk)
        seqs = [
            WireSequence(
                o.token_ids, o.logprobs, o.finish_reason == "stop", topk_arrays(o.top_logprobs or [], k) if k else None
            )
            for o in outs
        ]
        lp, top = prompt if prompt is not None else (None, None)
        if lp is not None and last_n is not None:  # only the last n prompt positions are scored
            cut = len(lp) - last_n
            lp = [math.nan] * cut + list(lp[cut:])
            if top is not None:
                top[0][:cut], top[1][:cut] = 0, MASK_LOGPROB
        as_json = {
            "type": "sample",
            "sequences": [
                {"tokens": q.tokens, "logprobs": q.logprobs, "stop_reason": "stop" if q.stop else "length"}
                for q in seqs
            ],
            "prompt_logprobs": None if lp is None else [None if math.isnan(x) else x for x in lp],
        }
        return Outcome(json=as_json, proto=encode_sample(seqs, lp, top if topk else None))

    rid = svc.futures.submit(None, work, thread=False)
    return future(rid, sample_sequence_ids=[f"{rid}:{i}" for i in range(body.num_samples)])


# -- futures --------------------------------------------------------------------------


@router.post("/retrieve_future")
async def retrieve_future(request: Request, svc: TinkerService = Depends(caller)) -> Response:
    body = await body_of(request, s.RetrieveFuture)
    outcome = await svc.futures.wait(body.request_id, POLL_S)
    if outcome is None:
        return JSONResponse({"type": "try_again", "request_id": body.request_id, "queue_state": "active"})
    if outcome.error is not None:
        return JSONResponse({"error": outcome.error, "category": outcome.category})
    if outcome.proto is not None and PROTO in request.headers.get("accept", ""):
        return Response(outcome.proto, media_type=PROTO)
    return JSONResponse(outcome.json or {})


def install(app: FastAPI, svc: TinkerService | None) -> None:
    """Mount the routes on `app` (the server's app): `svc` None answers 409 not_a_policy_server."""
    app.state.tinker = svc

    @app.exception_handler(TinkerError)
    async def _tinker(request: Request, exc: TinkerError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    app.include_router(router)


__all__ = ["install", "router"]
