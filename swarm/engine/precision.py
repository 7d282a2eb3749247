"""Where the torch engine runs and in what precision: a pure choice, and the optimizer it implies.

    placement = choose_placement("cuda", cuda_available=True, bf16_supported=True)
    # Placement(device='cuda', dtype='bfloat16', attn_implementation='sdpa', master_weights=True)

The rules, and why:

* `cpu` (and any device but CUDA) is what the embedded default always ran: fp32
  weights and the model's default attention. Nothing changes for a CPU user.
* `cuda` on a GPU with bf16 (Ampere or newer): bf16 weights, so generation
  reads half the bytes per token and the KV cache halves; PyTorch SDPA
  attention (`attn_implementation="sdpa"`: flash / memory-efficient kernels,
  no extra package). The optimizer keeps fp32 master weights: AdamW on bf16
  parameters rounds away updates smaller than ~0.4 % of a weight (bf16 keeps 8
  bits of mantissa), which at RL learning rates (1e-6..1e-5) is most of them.
  No autocast: the weights already are bf16, and the numerically delicate parts
  (log-softmax, the PPO ratio, KL, Adam moments) run in fp32 explicitly.
* `cuda` without bf16 (Volta/Turing): fp32 weights and SDPA; fp16 training
  would need loss scaling for a gain those cards rarely give on small models.
* `cuda` asked for but not available: a clear error, never a silent CPU run.

Two scheduling choices follow the device too (measured in docs/training-speed.md):

* CPU threads: half the cores (at least one), unless OMP_NUM_THREADS says
  otherwise. The server process runs its event loop beside the engine and the
  client fleets run beside the server; torch's default (every core) makes its
  OpenMP workers spin against them, which on a busy 2-core box made a training
  step ~10x and a collection step ~10x slower than one thread does.
* `fuse_pad_tokens`, the dead token positions the continuous batcher may spend to
  prefill newcomers in the same forward as the running rows' decode step: on a
  GPU a forward costs its launch overhead whatever a few thousand extra positions
  add; on a CPU every position costs compute, so fusing pays only for a handful.
* `share_prefix`, a group's shared prompt run once in a training step (the prefix's
  KV reused by every sample): on a CPU it saves compute, 2.3x on an arith-shaped
  step; on a GPU the step is launch-bound and the extra passes cost more than the
  positions they save: on an H200 the same step took 0.17 s shared against 0.10 s
  plain (docs/gpu.md), so a GPU trains plain.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PlacementError(ValueError):
    """A device or dtype this machine cannot give (no CUDA, no bf16, an unknown dtype): the user's
    flag, said in one line (`swarm serve` and `swarm train` print it without a traceback)."""


@dataclass(frozen=True)
class Placement:
    device: str
    dtype: str  # a key of DTYPES
    attn_implementation: str | None  # None: the model's own default (unchanged on CPU)
    master_weights: bool  # fp32 copies of low-precision weights held by the optimizer
    threads: int | None = None  # torch intra-op threads to set (None: leave torch's choice)
    fuse_pad_tokens: int = 32  # see the module docstring
    share_prefix: bool = True  # see the module docstring

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def cpu_threads(cpu_count: int | None, env: Mapping[str, str]) -> int | None:
    """Torch threads for a CPU engine: OMP_NUM_THREADS when set (None: torch already obeys it), else half the cores."""
    if env.get("OMP_NUM_THREADS"):
        return None
    return max(1, (cpu_count or 1) // 2)


def choose_placement(
    device: str | None,
    cuda_available: bool,
    bf16_supported: bool,
    dtype: str | None = None,
    cpu_count: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Placement:
    """The device, weight dtype, attention kernel, optimizer precision and scheduling of a torch engine.

    `device` None means CUDA when available, else CPU. `dtype` overrides the
    weight dtype ("float32", "bfloat16", "float16"); master weights follow from it.
    Raises PlacementError for an unknown dtype or a CUDA device on a machine without CUDA.
    """
    if dtype is not None and dtype not in DTYPES:
        raise PlacementError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    dev = device or ("cuda" if cuda_available else "cpu")
    if dev.startswith("cuda"):
        if not cuda_available:
            raise PlacementError(
                f"--device {dev}: asked for, but torch sees no CUDA GPU (torch {torch.__version__}); pass --device cpu"
            )
        chosen = dtype or ("bfloat16" if bf16_supported else "float32")
        if chosen == "bfloat16" and not bf16_supported:
            raise PlacementError("bfloat16 asked for, but this GPU does not support it; use float32")
        return Placement(
            dev, chosen, "sdpa", master_weights=chosen != "float32", fuse_pad_tokens=8192, share_prefix=False
        )
    chosen = dtype or "float32"
    threads = cpu_threads(cpu_count, env if env is not None else {}) if dev == "cpu" else None
    return Placement(dev, chosen, None, master_weights=chosen != "float32", threads=threads)


def device_problem(device: str | None) -> str | None:
    """Why this machine cannot give `device` (one line naming the flag), or None: what `swarm train`
    checks before it starts a server that would only fail on it."""
    try:
        detect_placement(device)
    except PlacementError as exc:
        return str(exc)
    return None


def detect_placement(device: str | None, dtype: str | None = None) -> Placement:
    """`choose_placement` with what this machine's torch reports."""
    cuda = torch.cuda.is_available()
    return choose_placement(
        device, cuda, bool(cuda and torch.cuda.is_bf16_supported()), dtype, cpu_count=os.cpu_count(), env=os.environ
    )


class MasterWeightAdamW:
    """AdamW whose parameters are fp32 copies of a low-precision model's weights.

    Backward writes bf16 gradients into the model; `gather_grads` copies them into
    the fp32 masters (where the grad-norm clip then runs), `step` updates the
    masters and writes them back, rounded, into the model. The state dict carries
    the masters, so a resumed run continues from the unrounded weights.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], **adamw: float | tuple[float, float]) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.inner = torch.optim.AdamW(self.master, **adamw)  # type: ignore[arg-type]

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def gather_grads(self) -> list[torch.Tensor]:
        """Model grads -> fp32 master grads; returns the masters (what to clip)."""
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()
        return self.master

    @torch.no_grad()
    def step(self) -> None:
        self.inner.step()
        torch._foreach_copy_(self.params, self.master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def sync_from_model(self) -> None:
        """After weights were loaded into the model from a checkpoint without masters."""
        torch._foreach_copy_(self.master, [p.float() for p in self.params])

    def state_dict(self) -> dict:
        return {"adamw": self.inner.state_dict(), "master": [m.detach().clone() for m in self.master]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if "adamw" not in state:  # an fp32 run's plain AdamW state: moments fit, masters from the model
            self.inner.load_state_dict(state)
            self.sync_from_model()
            return
        self.inner.load_state_dict(state["adamw"])
        for m, saved in zip(self.master, state["master"]):
            m.copy_(saved)
        torch._foreach_copy_(self.params, self.master)


def build_optimizer(
    model: torch.nn.Module, placement: Placement, params: list[torch.nn.Parameter] | None = None
) -> torch.optim.Optimizer | MasterWeightAdamW:
    """AdamW as the engine has always used it, over the parameters that train (all of them in full
    fine-tuning; a LoRA adapter's only, so the frozen base gets no state; `params`: those, one
    adapter of several); over fp32 masters when those are low precision (peft keeps adapters in
    fp32 on a bf16 base: no masters needed then)."""
    kw = {"lr": 1e-5, "betas": (0.9, 0.99), "eps": 1e-8}
    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    if placement.master_weights and any(p.dtype != torch.float32 for p in params):
        return MasterWeightAdamW(params, **kw)
    return torch.optim.AdamW(params, **kw)  # type: ignore[arg-type]


def grads_to_clip(model: torch.nn.Module, optimizer: object) -> list[torch.Tensor]:
    """The parameters whose gradients the step clips and the optimizer reads."""
    if isinstance(optimizer, MasterWeightAdamW):
        return optimizer.gather_grads()
    # the optimizer's own, not every parameter with a gradient: another policy's step on the same model
    # may hold gradients of its adapter at this moment (swarm/engine/policies.py)
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
