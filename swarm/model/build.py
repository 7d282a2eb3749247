"""Build the embedded model: tokenizer, tiny Qwen2, warm start; idempotent on disk.

    swarm model init                      # -> init_model(): ~1-2 min on 2 CPU cores
    from swarm.model.build import build_untrained
    build_untrained(tmp_path)             # tokenizer + random weights in seconds (tests)

The model is a ~1M-parameter Qwen2 (hidden 128, 2 heads of 64 — vLLM needs a
head_dim of at least 64 — 4 layers, tied embeddings), small enough to train on
a laptop CPU and standard enough that any Qwen2 loader (Hugging Face today;
vLLM and verl, the planned engines) reads it as any other Qwen2 checkpoint. `init_model` writes into a temporary sibling
directory and renames it into place, with a `roost_model.json` marker written
last: a directory with a matching marker is complete, anything else is rebuilt.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from store.paths import default_model_dir
from swarm.model.numerics import Progress, build_pinned
from swarm.model.recipe import VOCAB_SIZE, WarmStartConfig, is_complete, marker_for, matches
from swarm.model.tokenizer import CONTEXT_LENGTH, ENDOFTEXT, IM_END, build_tokenizer, render_chat, save_tokenizer
from swarm.model.version import BUILD_VERSION, MARKER
from swarm.tasks import get_task, list_tasks

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# torch and transformers are imported where a model is made, not here: a process that is not pinned
# (a user's `swarm model init`) hands the build to a pinned child (swarm/model/numerics.py), and paid
# ~8 s importing both only for the child to import them again

__all__ = [
    "BUILD_VERSION",
    "CONTEXT_LENGTH",
    "MARKER",
    "Progress",
    "build_model",
    "build_tokenizer",
    "build_untrained",
    "init_model",
    "is_complete",
    "model_config",
    "rich_progress",
    "task_corpus",
]


def task_corpus(seed: int = 0, per_task: int = 2000) -> list[str]:
    """Tokenizer training text: built-in task transcripts rendered with the chat template
    (and a task's tools, as the server renders them, so BPE learns `<tool_call>` and the spec)."""
    corpus: list[str] = []
    for name in list_tasks():
        task = get_task(name)
        for messages in task.transcripts(seed, per_task, noise=0.3):
            corpus.append(render_chat(messages, tools=task.tools))
    return corpus


def model_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """The tiny Qwen2 shape; the vocabulary is exactly the tokenizer's."""
    from transformers import Qwen2Config  # lazy: see the imports

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=CONTEXT_LENGTH,  # shapes no weight: see CONTEXT_LENGTH
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        use_sliding_window=False,
        dtype="float32",
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2ForCausalLM:
    """Random weights from `seed` (same seed, same weights)."""
    import torch  # lazy: see the imports
    from transformers import GenerationConfig, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(model_config(tokenizer))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
    )
    return model


def _save(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)


def build_untrained(out_dir: Path, seed: int = 0) -> Path:
    """Tokenizer + random weights, saved; for tests that need a loadable model fast."""
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(task_corpus(seed=0, per_task=500), VOCAB_SIZE)
    _save(build_model(tokenizer, seed), tokenizer, out_dir)
    return out_dir


def _clean_stale_temps(parent: Path, name: str) -> None:
    """Remove temp/aside dirs left by interrupted inits whose process is gone."""
    for p in [*parent.glob(f".{name}.tmp-*"), *parent.glob(f".{name}.old-*")]:
        try:
            pid = int(p.name.split("-")[-2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            continue


def init_model(
    out_dir: Path | None = None,
    seed: int = 0,
    force: bool = False,
    progress: Progress | None = None,
    config: WarmStartConfig | None = None,
) -> Path:
    """Build (or find) the warm-started embedded model and return its directory.

    Idempotent: a directory with a marker of this recipe and seed is returned
    untouched unless `force`. A non-empty directory that is not a Roost build is
    never overwritten without `force`. Deterministic from `seed`.
    """
    out_dir = Path(out_dir) if out_dir is not None else default_model_dir()
    config = config or WarmStartConfig()
    report = progress or (lambda message, fraction: None)
    if not force and matches(out_dir, seed, config):
        report("model ready", 1.0)
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out_dir):  # a concurrent init of the same dir waits, then finds it built
        if not force and matches(out_dir, seed, config):
            report("model ready", 1.0)
            return out_dir
        if out_dir.exists() and any(out_dir.iterdir()) and not force and not (out_dir / MARKER).exists():
            raise FileExistsError(f"{out_dir} exists and is not a Roost model; pass force=True")
        _clean_stale_temps(out_dir.parent, out_dir.name)
        _build(out_dir, seed, config, report)
    report("model ready", 1.0)
    return out_dir


@contextmanager
def _build_lock(out_dir: Path) -> Iterator[None]:
    with open(out_dir.with_name(f".{out_dir.name}.lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(out_dir: Path, seed: int, config: WarmStartConfig, report: Progress) -> None:
    """The build, on pinned CPU numerics (swarm/model/numerics.py): here when this process is pinned, else
    in a child that is."""
    args = {"out_dir": str(out_dir), "seed": seed, "config": config.as_dict()}
    build_pinned("swarm.model.build:pinned_build", args, report)


def pinned_build(out_dir: str, seed: int, config: dict, report: Progress) -> None:
    """`_build` from JSON arguments: what `build_pinned` runs, in this process or a pinned child."""
    _build_here(Path(out_dir), seed, WarmStartConfig(**config), report)


def _build_here(out_dir: Path, seed: int, config: WarmStartConfig, report: Progress) -> None:
    from swarm.model.warmstart import warm_start  # lazy: torch (see the imports)

    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{os.getpid()}-", dir=out_dir.parent))
    started = time.monotonic()
    try:
        report("training tokenizer", 0.0)
        tokenizer = build_tokenizer(task_corpus(seed), VOCAB_SIZE)
        model = build_model(tokenizer, seed)
        stats = warm_start(model, tokenizer, seed=seed, config=config, progress=lambda m, f: report(m, 0.02 + 0.96 * f))
        _save(model, tokenizer, tmp)
        (tmp / "roost_build_stats.json").write_text(
            json.dumps(
                {
                    **stats,
                    "build_seconds": round(time.monotonic() - started, 1),
                    "parameters": sum(p.numel() for p in model.parameters()),
                },
                indent=2,
            )
            + "\n"
        )
        marker = marker_for(seed, config)  # written last: its presence means complete
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        _swap_into_place(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the finished build over `out_dir`; the old one is moved aside first."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.time_ns()}")
        os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if old is not None and not out_dir.exists():
            os.rename(old, out_dir)
            old = None
        if not is_complete(out_dir):  # a concurrent init that won the race is fine
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def rich_progress(description: str = "building model") -> Iterator[Progress]:
    """A rich progress bar on stderr and the `progress` callback that drives it.

    with rich_progress() as progress:
        init_model(progress=progress)
    """
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    ]
    with Bar(*columns, console=Console(stderr=True), transient=False) as bar:
        tid = bar.add_task(description, total=1.0)

        def update(message: str, fraction: float) -> None:
            bar.update(tid, completed=fraction, description=message)

        yield update
