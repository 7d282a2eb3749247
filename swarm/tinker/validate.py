"""What a Tinker request's body must be: every check that refuses it (400 with a stable code) before
anything of it is queued, so a refused request applies nothing.

    body = parse_body(raw, s.CreateModel)          # a JSON body; 400 invalid_request, one readable line
    req = parse_fwdbwd(raw, content_type)          # protobuf (the SDK) or JSON -> FwdBwdWire
    datums, config = datums_of(service, req)       # lengths, token ids, the loss and its inputs
    adam = check_adam(body.adam_params)            # finite, lr >= 0, betas in [0, 1), eps > 0
    ids, params = sampling_params(service, body)   # the engine's SamplingParams of a sample request
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from swarm.config.options import errors_line
from swarm.tinker import schema as s
from swarm.tinker.errors import TinkerError
from swarm.tinker.wire import FwdBwdWire, WireDatum, WireError, decode_forward_backward

if TYPE_CHECKING:
    from swarm.tinker.service import TinkerService

PROTO = "application/x-protobuf"
MAX_SAMPLES = 64
MAX_TOPK = 20

B = TypeVar("B", bound=BaseModel)


def parse_body(raw: bytes, model: type[B]) -> B:
    """A route's JSON body (empty: `{}`), or 400 `invalid_request` saying in one line what is wrong
    (`model_id: Field required; ...`), never pydantic's dump of the input: every route's wording."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise TinkerError(400, "invalid_request", errors_line(exc.errors())) from None


def vocab_size(svc: TinkerService) -> int:
    """The token ids a request may name are [0, this): the torch host's vocabulary (on either engine)."""
    return int(svc.host.base.batcher.vocab_size)


def parse_fwdbwd(raw: bytes, content_type: str) -> FwdBwdWire:
    if PROTO in content_type:
        try:
            return decode_forward_backward(raw)
        except WireError as exc:
            raise TinkerError(400, "invalid_protobuf", str(exc)) from None
    body = parse_body(raw, s.ForwardBackwardBody)
    fb = body.forward_backward_input
    return FwdBwdWire(
        model_id=body.model_id,
        seq_id=body.seq_id or 0,
        loss_fn=fb.loss_fn,
        config=dict(fb.loss_fn_config or {}),
        data=[
            WireDatum(
                tokens=d.model_input.ids(),
                inputs={k: np.asarray(v.data, dtype=np.float64) for k, v in d.loss_fn_inputs.items()},
                non_text_chunks=sum(c.type != "encoded_text" for c in d.model_input.chunks),
            )
            for d in fb.data
        ],
    )


def datums_of(svc: TinkerService, req: FwdBwdWire) -> tuple[list[Any], dict[str, float]]:
    """The request's datums checked against the loss and the model (400 with a code, else)."""
    from swarm.algorithms.tinker_losses import LossInputError, check_inputs, loss_config  # lazy: torch
    from swarm.tinker.compute import Datum  # lazy: torch

    vocab = vocab_size(svc)
    try:
        config = loss_config(req.loss_fn, {k: v for k, v in req.config.items()})
        if not req.data:
            raise LossInputError("empty_batch", "forward_backward needs at least one datum")
        out = []
        for n, d in enumerate(req.data):
            if d.non_text_chunks:
                raise LossInputError("unsupported_input", f"datum {n}: only encoded_text chunks are supported")
            if not d.tokens or len(d.tokens) > svc.max_context:
                raise LossInputError("invalid_length", f"datum {n}: 1 to {svc.max_context} tokens")
            targets = d.inputs.get("target_tokens")
            if targets is None:
                raise LossInputError("missing_loss_input", f"datum {n}: loss_fn_inputs['target_tokens'] is required")
            targets = targets.reshape(-1)
            if len(targets) != len(d.tokens):
                raise LossInputError(
                    "length_mismatch", f"datum {n}: {len(targets)} target_tokens for {len(d.tokens)} input tokens"
                )
            ids = [int(t) for t in d.tokens]
            tgt = [int(t) for t in targets]
            if any(not 0 <= t < vocab for t in ids + tgt):
                raise LossInputError("invalid_token", f"datum {n}: token ids must lie in [0, {vocab})")
            rest = {k: [float(x) for x in v.reshape(-1)] for k, v in d.inputs.items() if k != "target_tokens"}
            check_inputs(req.loss_fn, len(ids), rest)
            out.append(Datum(ids, tgt, rest))
    except LossInputError as exc:
        raise TinkerError(400, exc.code, exc.message) from None
    return out, config


def check_adam(p: s.AdamParamsBody) -> s.AdamParamsBody:
    if not all(math.isfinite(v) for v in p.model_dump().values()):
        raise TinkerError(400, "invalid_adam_params", "every AdamParams value must be finite")
    if p.learning_rate < 0 or p.eps <= 0 or p.weight_decay < 0 or p.grad_clip_norm < 0:
        raise TinkerError(400, "invalid_adam_params", "learning_rate, weight_decay, grad_clip_norm >= 0; eps > 0")
    if not (0 <= p.beta1 < 1 and 0 <= p.beta2 < 1):
        raise TinkerError(400, "invalid_adam_params", "beta1 and beta2 must lie in [0, 1)")
    return p


def sampling_params(svc: TinkerService, body: s.Sample) -> Any:
    from swarm.engine.base import SamplingParams  # lazy: beside the engine's other imports

    sp = body.sampling_params
    ids = body.prompt.ids()
    if not ids or len(ids) >= svc.max_context:
        raise TinkerError(400, "invalid_length", f"the prompt must hold 1 to {svc.max_context - 1} tokens")
    if any(c.type != "encoded_text" for c in body.prompt.chunks):
        raise TinkerError(400, "unsupported_input", "only encoded_text chunks are supported")
    vocab = vocab_size(svc)
    if any(not 0 <= t < vocab for t in ids):  # refused here, not as the engine's error in the future
        raise TinkerError(400, "invalid_token", f"prompt token ids must lie in [0, {vocab})")
    if sp.top_k not in (-1, 0):
        raise TinkerError(400, "unsupported_sampling_param", "top_k is not supported (use -1)")
    if not (math.isfinite(sp.temperature) and sp.temperature >= 0 and 0 < sp.top_p <= 1):
        raise TinkerError(400, "invalid_sampling_params", "temperature >= 0 and 0 < top_p <= 1")
    if not 1 <= body.num_samples <= MAX_SAMPLES:
        raise TinkerError(400, "invalid_num_samples", f"num_samples must lie in [1, {MAX_SAMPLES}]")
    if body.target_prompt_logprobs is not None or body.prompt_alt_tokens_k:
        raise TinkerError(
            400, "unsupported_sampling_param", "target_prompt_logprobs and prompt_alt_tokens_k are not supported"
        )
    if not (0 <= body.topk_sample_logprobs <= MAX_TOPK and 0 <= body.topk_prompt_logprobs <= MAX_TOPK):
        raise TinkerError(400, "invalid_sampling_params", f"top-k logprobs: 0 to {MAX_TOPK}")
    last_n = body.prompt_logprobs_last_n
    if last_n is not None and not 1 <= last_n <= len(ids) - 1:
        raise TinkerError(400, "invalid_sampling_params", f"prompt_logprobs_last_n must lie in [1, {len(ids) - 1}]")
    max_tokens = sp.max_tokens if sp.max_tokens is not None else 256
    max_tokens = min(max_tokens, svc.max_context - len(ids))
    if max_tokens < 1:
        raise TinkerError(400, "invalid_max_tokens", "max_tokens must be >= 1")
    stop = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
    strs = tuple(x for x in stop if isinstance(x, str))
    toks = tuple(int(x) for x in stop if not isinstance(x, str))
    return ids, SamplingParams(
        max_tokens=max_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        seed=sp.seed,
        stop=strs,
        stop_token_ids=toks,
        ignore_eos=sp.stop is not None and not stop,  # Tinker: [] disables every stop, EOS included
        top_logprobs=body.topk_sample_logprobs,
    )


__all__ = ["check_adam", "datums_of", "parse_body", "parse_fwdbwd", "sampling_params", "vocab_size"]
