"""LoRA for the torch engine through peft: attach an adapter, check it, find the model inside, save, load.

    model = attach(AutoModelForCausalLM.from_pretrained(d), LoraSettings(rank=8), d)  # a peft model
    with adapters_off(model): ...        # the frozen base: the KL reference, no second copy
    unwrap(model)                        # the HF model inside (LoRA layers injected in place)

peft injects its LoRA layers into the Hugging Face model in place, so the model *inside*
the peft wrapper (`unwrap`) computes base + adapter with the plain HF forward: the continuous
batcher and the shared-prefix training forward use it unchanged (its `lm_head`, its
`base_model` transformer, its KV cache). `adapters_off` switches every adapter off for the
length of a `with` (peft's `disable_adapter`): the single-adapter torch engine runs its KL
reference forward that way, under the lock that keeps generation out, so no forward ever sees a
half-switched model. A host of several policies switches nothing (swarm/engine/adapter_routing.py).

Nothing here imports peft until a LoRA engine is built: full fine-tuning (rank 0) never loads it,
and `is_peft` asks `sys.modules`, so checking costs nothing either.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from swarm.config.lora import LoraSettings, rank_too_wide
from swarm.engine.adapter_files import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LoraError,
    check_saved,
    is_adapter_dir,
    read_adapter_config,
)
from swarm.engine.adapter_routing import is_routed, route


def is_peft(model: Any) -> bool:
    """Whether `model` is a peft wrapper (no peft import: nothing is one unless peft was loaded)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model a peft wrapper holds (its adapters live in its layers), else `model`."""
    return model.get_base_model() if is_peft(model) else model


def adapters_off(model: Any) -> AbstractContextManager[Any]:
    """For a peft model: its adapters switched off inside the `with` (the base alone); else nothing.

    A host of several policies routes adapters per thread (swarm/engine/adapter_routing.py): there
    only this thread's forwards run the base, generation beside it keeps its adapters."""
    if is_routed(model):
        return route(off=True)
    return model.disable_adapter() if is_peft(model) else contextlib.nullcontext()


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft asks transformers' deprecated `is_gradient_checkpointing` when wrapping: a FutureWarning per
    engine start that says nothing to a Roost user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def lora_config(settings: LoraSettings) -> Any:
    """peft's `LoraConfig` for `settings` (one place: every adapter of every policy is built from it)."""
    from peft import LoraConfig  # lazy: peft (and accelerate) take seconds; rank 0 never needs them

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def attach(
    model: torch.nn.Module, settings: LoraSettings, base_dir: Path, adapter_name: str = "default"
) -> torch.nn.Module:
    """`model` wrapped by peft with a fresh adapter (B = 0: the policy starts equal to the base).

    Only the adapter's parameters require grad afterwards. Raises `LoraError` when the targets
    match no layer or the rank exceeds a target layer's width (a rank-r update of an
    in x out layer has rank at most min(in, out): a larger r only wastes memory and misleads).
    """
    from peft import get_peft_model  # lazy: see lora_config

    if targeted := targeted_layers(model, settings):  # none: peft's own error below names the targets
        check_rank(model, settings.rank, layers=targeted)
    try:
        with quiet_peft():
            wrapped = get_peft_model(model, lora_config(settings), adapter_name=adapter_name)
    except ValueError as exc:  # peft: target modules not found
        raise LoraError(f"LoRA targets {settings.targets}: {exc}") from None
    check_rank(wrapped, settings.rank)
    wrapped.peft_config[adapter_name].base_model_name_or_path = str(Path(base_dir).resolve())
    return wrapped


def add_adapter(model: Any, name: str, settings: LoraSettings, base_dir: Path) -> None:
    """One more named adapter on a peft model (another policy on the same base); `LoraError` as `attach`.

    A failed add leaves nothing behind: the half-added adapter is deleted again.
    """
    if targeted := targeted_layers(model, settings):
        check_rank(model, settings.rank, adapter_name=name, layers=targeted)
    try:
        with quiet_peft():
            model.add_adapter(name, lora_config(settings))
    except ValueError as exc:
        raise LoraError(f"policy {name!r}: LoRA targets {settings.targets}: {exc}") from None
    try:
        check_rank(model, settings.rank, adapter_name=name)
    except LoraError:
        model.delete_adapter(name)
        raise
    model.peft_config[name].base_model_name_or_path = str(Path(base_dir).resolve())


def adapted_layers(model: torch.nn.Module, adapter_name: str | None = None) -> dict[str, tuple[int, int]]:
    """(in features, out features) of every layer an adapter (`adapter_name`: that one) wraps, by module name."""
    from peft.tuners.lora import LoraLayer  # lazy: only ever called on a peft model (peft already loaded)

    return {
        name: (int(m.in_features), int(m.out_features))
        for name, m in model.named_modules()
        if isinstance(m, LoraLayer) and (adapter_name is None or adapter_name in m.lora_A)
    }


def targeted_layers(model: torch.nn.Module, settings: LoraSettings) -> dict[str, tuple[int, int]]:
    """(in, out) of every layer `settings`' targets name, by peft's own matching, before any adapter exists.

    Why before: peft allocates the whole adapter first, and a rank far past a layer's width (a typo,
    `--lora-rank 100000`) then takes seconds and gigabytes to be refused. The layers of a model peft
    already wraps are its LoRA layers (their `base_layer` children are not targets by name).
    """
    from peft.tuners.tuners_utils import check_target_module_exists  # lazy: see lora_config

    config = lora_config(settings)
    try:  # "all-linear" (the default) is a shorthand peft expands into module names before it matches any
        from peft.tuners.tuners_utils import _maybe_include_all_linear_layers  # lazy: see lora_config
    except ImportError:  # a peft without it: the layers are checked after peft wraps them (attach, add_adapter)
        pass
    else:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = _maybe_include_all_linear_layers(config, base)
    return {
        name: (int(m.in_features), int(m.out_features))
        for name, m in model.named_modules()
        if isinstance(getattr(m, "in_features", None), int)
        and isinstance(getattr(m, "out_features", None), int)
        and check_target_module_exists(config, name)
    }


def check_rank(
    model: torch.nn.Module, rank: int, adapter_name: str | None = None, layers: dict[str, tuple[int, int]] | None = None
) -> None:
    """`LoraError` naming the narrowest target layer when `rank` exceeds its width (`layers`: those, else the
    layers an adapter wraps)."""
    layers = adapted_layers(model, adapter_name) if layers is None else layers
    if not layers:
        raise LoraError("the LoRA targets matched no linear layer of the model")
    name, (fan_in, fan_out) = min(layers.items(), key=lambda kv: min(kv[1]))
    if problem := rank_too_wide(rank, name.removeprefix("base_model.model."), fan_in, fan_out):
        raise LoraError(problem)


def save_adapter(model: torch.nn.Module, path: Path, adapter_name: str = "default") -> None:
    """One adapter's weights and peft config (adapter_model.safetensors, adapter_config.json), not the base.

    The same two files whatever the adapter's name (peft's own `save_pretrained` puts a
    non-default adapter in a sub-folder), so every policy's checkpoint exports, evaluates and
    loads into vLLM the same way.
    """
    if adapter_name == "default":
        model.save_pretrained(str(path), safe_serialization=True, save_embedding_layers=False)
        return
    from peft import get_peft_model_state_dict  # lazy: peft already loaded (a LoRA engine)
    from safetensors.torch import save_file  # lazy: beside peft's

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(path / ADAPTER_WEIGHTS))
    model.peft_config[adapter_name].save_pretrained(str(path))


def load_adapter(model: torch.nn.Module, path: Path, settings: LoraSettings, adapter_name: str = "default") -> None:
    """Load a saved adapter into `model`'s (same shape) adapter; `LoraError` when it does not fit."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict  # lazy: peft already loaded (a LoRA engine)
    from safetensors.torch import load_file  # lazy: beside peft's, only for a LoRA checkpoint

    path = Path(path)
    check_saved(path, settings)
    device = next(model.parameters()).device
    state = load_file(str(path / ADAPTER_WEIGHTS), device=str(device))
    expected = get_peft_model_state_dict(model, adapter_name=adapter_name)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise LoraError(
            f"checkpoint {path} wraps other layers than --lora-targets {settings.targets}: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    set_peft_model_state_dict(model, {k: v.to(expected[k].dtype) for k, v in state.items()}, adapter_name=adapter_name)


__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "LoraError",
    "adapted_layers",
    "add_adapter",
    "adapters_off",
    "attach",
    "check_rank",
    "check_saved",
    "is_adapter_dir",
    "is_peft",
    "load_adapter",
    "lora_config",
    "quiet_peft",
    "read_adapter_config",
    "save_adapter",
    "unwrap",
]
