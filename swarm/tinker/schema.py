"""The JSON bodies of the Tinker routes, as the tinker 0.38 SDK sends and reads them (pydantic).

Field names and shapes are the SDK's own (`tinker/types/*.py`); only what this server reads is
declared, and unknown fields are ignored (a newer SDK adds some), while a field of the wrong type
is a 400 `invalid_request`. `forward_backward` arrives as protobuf (`wire.py`), and its JSON form
(`ForwardBackwardBody`, what a plain HTTP client sends) is decoded into the same `FwdBwdWire`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSession(Body):
    tags: list[str] = Field(default_factory=list)
    user_metadata: dict[str, Any] | None = None
    sdk_version: str = ""


class SessionRef(Body):
    session_id: str


class LoraConfigBody(Body):
    rank: int = 32
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModel(Body):
    session_id: str
    model_seq_id: int = 0
    base_model: str
    lora_config: LoraConfigBody | None = None
    user_metadata: dict[str, Any] | None = None


class ModelRef(Body):
    model_id: str


class AdamParamsBody(Body):
    """Tinker's `AdamParams`: the client owns the schedule, every step names its own values."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class OptimStep(Body):
    model_id: str
    seq_id: int | None = None
    adam_params: AdamParamsBody | None = None
    optim_params: AdamParamsBody | None = None
    optimizer_params: dict[str, Any] | None = None


class SaveWeights(Body):
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    sampling_session_seq_id: int | None = None


class LoadWeights(Body):
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    path: str
    optimizer: bool = False


class CreateSamplingSession(Body):
    session_id: str
    sampling_session_seq_id: int = 0
    base_model: str | None = None
    model_path: str | None = None


class Chunk(Body):
    type: str = "encoded_text"
    tokens: list[int] = Field(default_factory=list)


class ModelInputBody(Body):
    chunks: list[Chunk]

    def ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.tokens]


class SamplingParamsBody(Body):
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


class Sample(Body):
    num_samples: int = 1
    prompt: ModelInputBody
    sampling_params: SamplingParamsBody = Field(default_factory=SamplingParamsBody)
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None
    target_prompt_logprobs: dict[str, Any] | None = None  # not supported: refused
    prompt_alt_tokens_k: int = 0  # not supported: refused


class TensorBody(Body):
    data: list[float]
    dtype: Literal["float32", "int64"] = "float32"
    shape: list[int] | None = None


class DatumBody(Body):
    model_input: ModelInputBody
    loss_fn_inputs: dict[str, TensorBody]


class FwdBwdInputBody(Body):
    data: list[DatumBody]
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None = None


class ForwardBackwardBody(Body):
    """The JSON form of a forward(_backward) request (the SDK itself sends protobuf)."""

    model_id: str
    seq_id: int | None = None
    forward_backward_input: FwdBwdInputBody


class RetrieveFuture(Body):
    request_id: str
    allow_metadata_only: bool = False


__all__ = [
    "AdamParamsBody",
    "CreateModel",
    "CreateSamplingSession",
    "CreateSession",
    "ForwardBackwardBody",
    "LoadWeights",
    "ModelRef",
    "OptimStep",
    "RetrieveFuture",
    "Sample",
    "SaveWeights",
    "SessionRef",
]
