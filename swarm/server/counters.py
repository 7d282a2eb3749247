"""The server's counters: one object every component writes through, and status reads.

`Swarm` owns one `Counters` and hands it to whoever counts (leases, durability, live
control, the 5xx middleware, generation). Writers call `add` or `set`; readers index it
like a `collections.Counter` (a name never counted reads 0) or take a `snapshot()`.
Checkpoint compaction writes from a worker thread, so every access takes the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any


class Counters(Mapping[str, int]):
    """Named integer counters, written through `add`/`set` only."""

    def __init__(self) -> None:
        self._values: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        """Count `n` more of `name`; adding 0 still makes the name appear (status shows it)."""
        with self._lock:
            self._values[name] = self._values.get(name, 0) + int(n)

    def set(self, name: str, value: int) -> None:
        """Overwrite `name`: a counter rebuilt from the durable buffer, not counted on."""
        with self._lock:
            self._values[name] = int(value)

    def merge(self, values: Mapping[str, int]) -> None:
        """Add every counter of `values` (a resumed checkpoint's counters on top of this run's)."""
        with self._lock:
            for name, n in values.items():
                self._values[name] = self._values.get(name, 0) + int(n)

    def snapshot(self) -> dict[str, int]:
        """A copy, consistent at one instant, safe to serialise while others keep counting."""
        with self._lock:
            return dict(self._values)

    # -- read like a Counter ---------------------------------------------------
    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)

    def get(self, name: str, default: Any = None) -> Any:
        """Like `dict.get`: the default (not 0) for a name never counted."""
        with self._lock:
            return self._values.get(name, default)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def __repr__(self) -> str:
        return f"Counters({self.snapshot()!r})"


__all__ = ["Counters"]
