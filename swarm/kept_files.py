"""An earlier run's files, kept while a start over it (`swarm train --resume`) rewrites them, and put back
if that start fails before its server is up.

    kept = KeptFiles.take(out, ("run.yaml", "server.yaml", "summary.json"))
    ...                                   # run.yaml and server.yaml rewritten; the server refuses them
    kept.restore()                        # the run reads as it did: finished, with its own settings

A start that fails there trained nothing. Had it left its settings in run.yaml and `failed` in
summary.json, a finished run would read failed, and a plain `--resume` would fail the same way, on the
refused settings. The files are taken before anything is written and put back on such a failure, rather
than written only once the server is up: the server reads its settings from server.yaml, and a first run
whose server never started is resumed from its run.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KeptFiles", "RunUnchanged"]


@dataclass
class KeptFiles:
    """The files of `names` (relative to `out`) that existed, byte for byte."""

    out: Path
    texts: dict[str, bytes]

    @classmethod
    def take(cls, out: Path, names: Iterable[str]) -> KeptFiles:
        return cls(out, {name: (out / name).read_bytes() for name in names if (out / name).is_file()})

    @property
    def summary(self) -> bytes | None:
        """The earlier run's summary.json, None without one (a first start: its failure is recorded)."""
        return self.texts.get("summary.json")

    @property
    def status(self) -> str:
        try:
            return str(json.loads(self.summary or b"{}").get("status", "unknown"))
        except (ValueError, AttributeError):
            return "unknown"

    def restore(self) -> None:
        """Each kept file as it was, replaced whole (a file this start made that was not there stays)."""
        for name, text in self.texts.items():
            path = self.out / name
            tmp = path.with_name(f".{path.name}.kept")
            tmp.write_bytes(text)
            tmp.replace(path)


class RunUnchanged(RuntimeError):
    """A start over an earlier run that failed before its server was up: that run is as it was (`KeptFiles`)."""

    def __init__(self, error: str, out: Path, status: str) -> None:
        super().__init__(error)
        self.note = (
            f"the run in {out} is as it was before this start: its run.yaml and summary.json "
            f"(status: {status}) are untouched"
        )
