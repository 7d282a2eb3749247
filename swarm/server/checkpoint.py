"""Checkpoints: `out_dir/checkpoints/step_XXXXXX/` plus a `latest` pointer.

A checkpoint is whatever `engine.save(dir)` writes (for the torch engine: an HF
model dir with tokenizer and optimizer state) plus `server_state.json` (step,
policy version, window, counters). It is written into a temporary sibling and
renamed into place, and `latest` (a symlink, replaced atomically) is moved only
after that: a crash leaves either the old or the new checkpoint, never half of
one. On start the server loads `latest` (or, if the pointer is missing or broken,
the highest complete `step_*`), so weights and policy version carry on.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

STATE_FILE = "server_state.json"
LATEST = "latest"


class Checkpointer:
    def __init__(self, root: Path, keep: int | None = None) -> None:
        self.root = Path(root)
        self.keep = keep

    @staticmethod
    def name(step: int) -> str:
        return f"step_{step:06d}"

    def save(self, engine: Any, step: int, state: dict[str, Any]) -> Path:
        """Blocking (call it in a worker thread); returns the checkpoint directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / self.name(step)
        tmp = self.root / f".tmp-{self.name(step)}-{os.getpid()}-{time.time_ns()}"
        try:
            engine.save(tmp)
            payload = {**state, "step": step, "saved_at": time.time()}
            write_atomic(tmp / STATE_FILE, json.dumps(payload, indent=2, sort_keys=True))
            if final.exists():  # the same step saved twice (periodic, then on stop)
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        link = self.root / f".{LATEST}.tmp-{os.getpid()}"
        link.unlink(missing_ok=True)
        os.symlink(final.name, link)
        os.replace(link, self.root / LATEST)
        self._prune(final)
        return final

    def _prune(self, newest: Path) -> None:
        if not self.keep:
            return
        done = self.complete()
        for old in done[: max(0, len(done) - self.keep)]:
            if old != newest:
                shutil.rmtree(old, ignore_errors=True)

    def complete(self) -> list[Path]:
        """Finished checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("step_*") if (p / STATE_FILE).is_file())

    def latest(self) -> Path | None:
        pointer = self.root / LATEST
        if pointer.exists() and (pointer / STATE_FILE).is_file():
            return pointer.resolve()
        done = self.complete()
        return done[-1] if done else None

    @staticmethod
    def read_state(path: Path) -> dict[str, Any]:
        return json.loads((Path(path) / STATE_FILE).read_text())


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` via a fsync'd temporary file: a crash leaves the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
