"""Tinker checkpoints on disk: `tinker://` paths, atomic saves, the list, loads.

    tinker://MODEL_ID/weights/NAME          ->  OUT/tinker/MODEL_ID/weights/NAME/           (save_state)
    tinker://MODEL_ID/sampler_weights/NAME  ->  OUT/tinker/MODEL_ID/sampler_weights/NAME/   (for sampling)

A checkpoint folder holds what a policy checkpoint of the swarm server holds (the adapter's
`adapter_model.safetensors` and `adapter_config.json`, the tokenizer, `optimizer.pt`,
`engine_state.json`: so `swarm model export --merge` and `swarm eval` read it) plus `tinker.json`
(who saved it, when, its rank). A save is written to a temporary folder, fsync'd and renamed into
place before its future resolves: an acknowledged save survives kill -9, a save cut halfway by one
leaves no folder under its name. Paths name folders under the server's out dir only (no `..`, no
absolute paths), so a request cannot read or write anywhere else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.engine.lora import load_adapter
from swarm.engine.policies import PolicyEngine
from swarm.engine.precision import MasterWeightAdamW
from swarm.engine.torch_engine import OPTIMIZER_FILE, STATE_FILE, load_optimizer

KINDS = {"weights": "training", "sampler_weights": "sampler"}
META = "tinker.json"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_MODEL = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


class PathError(ValueError):
    """A tinker path this server cannot name (400 `invalid_path`), or one with nothing saved (404)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class TinkerPath:
    model_id: str
    kind: str  # "weights" | "sampler_weights"
    name: str

    @property
    def uri(self) -> str:
        return f"tinker://{self.model_id}/{self.kind}/{self.name}"

    def folder(self, root: Path) -> Path:
        return root / folder_name(self.model_id) / self.kind / self.name


def folder_name(model_id: str) -> str:
    """A model id (`SESSION:train:N`, the SDK derives it so) as a folder and policy name: `SESSION-train-N`."""
    return model_id.replace(":", "-")


def model_id_ok(model_id: str) -> bool:
    """A model id a save can be made under: its characters, and not `.` or `..` (a folder above)."""
    return bool(_MODEL.match(model_id)) and set(model_id) != {"."}


def run_folder(root: Path, model_id: str) -> Path | None:
    """The folder of `model_id`'s saves; None for an id no save is made under, or one never saved."""
    if not model_id_ok(model_id):
        return None
    folder = root / folder_name(model_id)
    return folder if folder.is_dir() else None


def parse(uri: str) -> TinkerPath:
    if not uri.startswith("tinker://"):
        raise PathError("invalid_path", f"{uri!r} is not a tinker:// path")
    parts = uri[len("tinker://") :].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not model_id_ok(parts[0]) or not _NAME.match(parts[2]):
        raise PathError(
            "invalid_path",
            f"{uri!r}: expected tinker://MODEL_ID/weights/NAME or tinker://MODEL_ID/sampler_weights/NAME",
        )
    if parts[2] in (".", ".."):
        raise PathError("invalid_path", f"{uri!r}: bad checkpoint name")
    return TinkerPath(parts[0], parts[1], parts[2])


def check_name(name: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise PathError("invalid_path", f"checkpoint name {name!r}: 1-128 letters, digits, '_', '.', '-'")
    return name


def existing(root: Path, path: TinkerPath) -> Path:
    folder = path.folder(root)
    if not (folder / META).is_file():
        raise PathError("checkpoint_not_found", f"nothing is saved at {path.uri}")
    return folder


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(policy: PolicyEngine, root: Path, path: TinkerPath, meta: dict[str, Any]) -> Path:
    """Write `policy`'s adapter, optimizer and version at `path`, atomically (replacing an older save)."""
    final = path.folder(root)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{path.name}.tmp-{time.time_ns()}"
    policy.save(tmp)
    (tmp / META).write_text(json.dumps({**meta, "tinker_path": path.uri, "time": time.time()}))
    _fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.parent / f".{path.name}.old-{time.time_ns()}"
        final.rename(old)
    tmp.rename(final)
    dfd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / META).read_text())


def load(policy: PolicyEngine, folder: Path, with_optimizer: bool) -> None:
    """The saved adapter into `policy` (its rank must match); with `with_optimizer` also its AdamW
    state and version, else a fresh optimizer state (Tinker's `load_state`)."""
    host = policy.host
    with host.exclusive():
        model = policy._live()
        load_adapter(model, folder, policy.lora, adapter_name=policy.adapter)
        host.base.batcher.weights_changed(policy.adapter)
        opt = policy.optimizer
        if isinstance(opt, MasterWeightAdamW):
            opt.sync_from_model()
        if with_optimizer and (folder / OPTIMIZER_FILE).exists():
            load_optimizer(opt, model, folder / OPTIMIZER_FILE, host.base.device)
        else:
            inner = opt.inner if isinstance(opt, MasterWeightAdamW) else opt
            inner.state.clear()  # type: ignore[union-attr]
        opt.zero_grad(set_to_none=True)
        if with_optimizer and (folder / STATE_FILE).exists():
            policy.policy_version = int(json.loads((folder / STATE_FILE).read_text())["policy_version"])


def listing(root: Path, model_id: str) -> list[dict[str, Any]]:
    """Tinker's `Checkpoint` records of a model's saves, oldest first."""
    out = []
    for kind, ctype in KINDS.items():
        base = root / folder_name(model_id) / kind
        if not base.is_dir():
            continue
        for folder in base.iterdir():
            if folder.name.startswith(".") or not (folder / META).is_file():
                continue
            meta = read_meta(folder)
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            out.append(
                {
                    "checkpoint_id": f"{kind}/{folder.name}",
                    "checkpoint_type": ctype,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meta.get("time", 0))),
                    "tinker_path": meta.get("tinker_path", f"tinker://{model_id}/{kind}/{folder.name}"),
                    "size_bytes": size,
                    "public": False,
                }
            )
    return sorted(out, key=lambda c: c["time"])


__all__ = [
    "KINDS",
    "PathError",
    "TinkerPath",
    "check_name",
    "existing",
    "folder_name",
    "listing",
    "load",
    "model_id_ok",
    "parse",
    "read_meta",
    "run_folder",
    "save",
]
