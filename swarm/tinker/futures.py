"""Tinker's futures: every training or sampling request answers a `request_id` at once, its result
is fetched with `retrieve_future`, and the requests of one model run one at a time in the order
they were accepted (Tinker's promise: a forward_backward, then the optim_step sent after it).

    table = FutureTable()
    rid = table.submit(lane="model-1", work=lambda: compute(...))     # runs after lane's earlier work
    outcome = await table.wait(rid, timeout=20)                       # None: still running

A request id is `BOOT-N`: the id of the server process that issued it (`boot`, 8 hex digits) and
its count there. The boots of the processes that issued ids on an out dir are kept in a ledger
file there, so a future asked for after a restart (kill -9, crash) is told apart from one never
issued: the first fails with `future_lost` (an error the SDK raises as `RequestFailedError`,
instead of polling forever), the second is 404 `future_not_found`. Results are kept in memory
only: what must outlive a crash is a saved state on disk.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.tinker.errors import TinkerError

log = logging.getLogger("swarm.tinker")

KEPT = 4096  # finished results kept for retrieval (an SDK fetches each once, soon after it is done)
REQUEST_ID = re.compile(r"^([0-9a-f]{8})-([1-9][0-9]*)$")  # BOOT-N, as `FutureTable.new_id` makes them


class UserError(Exception):
    """A request the caller got wrong, found only while it runs: its future fails with category
    `user` and the stable `code` in the message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Outcome:
    """A finished future: a JSON result, a protobuf result (`proto`), or an error."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "server"  # Tinker's RequestErrorCategory: user | server | unknown


class FutureTable:
    """Futures by request id, and one ordered lane of work per model.

    `ledger`: a file that lists the boots of the server processes that issued request ids (this one
    appends its own before its first id), so an id of an earlier process is `future_lost` and any
    other id 404 `future_not_found`. Without one, every well-formed id of another boot is taken
    for an earlier process's."""

    def __init__(self, ledger: Path | None = None) -> None:
        self.boot = secrets.token_hex(4)
        self.ledger = ledger
        self.earlier = _read_boots(ledger)
        self._issued = 0  # ids issued so far: N of the last one
        self._done: OrderedDict[str, Outcome] = OrderedDict()
        self._events: dict[str, asyncio.Event] = {}
        self._lanes: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def new_id(self) -> str:
        if self._issued == 0:
            _record_boot(self.ledger, self.boot)  # before the first id leaves: a restart must know it
        self._issued += 1
        return f"{self.boot}-{self._issued}"

    def submit(self, lane: str | None, work: Callable[[], Outcome | Any], thread: bool = True) -> str:
        """Start `work` (in a worker thread unless `thread=False`, then it is a coroutine function)
        after the earlier work of `lane` (None: no order, e.g. sampling); its request id."""
        rid = self.new_id()
        self._events[rid] = asyncio.Event()
        lock = self._lanes.setdefault(lane, asyncio.Lock()) if lane is not None else None
        task = asyncio.get_running_loop().create_task(self._run(rid, lock, work, thread))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return rid

    async def _run(self, rid: str, lock: asyncio.Lock | None, work: Callable[[], Any], thread: bool) -> None:
        try:
            if lock is not None:
                async with lock:  # asyncio.Lock wakes waiters first come, first served: the accept order
                    result = await (asyncio.to_thread(work) if thread else work())
            else:
                result = await (asyncio.to_thread(work) if thread else work())
            outcome = result if isinstance(result, Outcome) else Outcome(json=result)
        except UserError as exc:
            outcome = Outcome(error=f"{exc.code}: {exc.message}", category="user")
        except Exception as exc:  # the future fails with the reason; the server goes on
            log.exception("tinker request %s failed", rid)
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}", category="server")
        self._finish(rid, outcome)

    def _finish(self, rid: str, outcome: Outcome) -> None:
        self._done[rid] = outcome
        while len(self._done) > KEPT:
            old, _ = self._done.popitem(last=False)
            self._events.pop(old, None)
        event = self._events.get(rid)
        if event is not None:
            event.set()

    def resolved(self, value: dict[str, Any]) -> str:
        """A future already done (create_session-style work that needs no lane)."""
        rid = self.new_id()
        self._events[rid] = asyncio.Event()
        self._finish(rid, Outcome(json=value))
        return rid

    async def wait(self, rid: str, timeout: float) -> Outcome | None:
        """The outcome of `rid` once done (waiting up to `timeout` s; None: still running).

        An id of an earlier server process, or one whose result is forgotten, is an error outcome at
        once; an id no process of this server issued is 404 `future_not_found`."""
        if rid in self._done:
            return self._done[rid]
        event = self._events.get(rid)
        if event is None:
            return self._missing(rid)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return None
        return self._done.get(rid)

    def _missing(self, rid: str) -> Outcome:
        """The outcome of an id this process holds nothing for; 404 for one it could not have issued."""
        match = REQUEST_ID.match(rid)
        if match is None:
            raise TinkerError(404, "future_not_found", f"no request {rid!r}: request ids are BOOT-N, as issued")
        boot, n = match.group(1), int(match.group(2))
        if boot == self.boot and n <= self._issued:
            return Outcome(
                error=f"future_expired: the result of request {rid} is no longer kept (the last {KEPT} are)",
                category="user",
            )
        if boot != self.boot and (self.ledger is None or boot in self.earlier):
            return Outcome(
                error=f"future_lost: request {rid} was accepted by a server process that has since "
                "stopped (restart, kill -9 or crash) before its result was kept; nothing it did after "
                "the last saved state is durable: load_state the last checkpoint and send it again",
                category="server",
            )
        raise TinkerError(404, "future_not_found", f"no request {rid!r} was issued by this server")

    async def drain(self) -> None:
        """Let work in flight finish (the server is stopping)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _read_boots(ledger: Path | None) -> frozenset[str]:
    """The boots a ledger lists (none yet: an empty set)."""
    if ledger is None or not ledger.is_file():
        return frozenset()
    return frozenset(line.strip() for line in ledger.read_text().splitlines() if line.strip())


def _record_boot(ledger: Path | None, boot: str) -> None:
    """Append `boot` to the ledger. A ledger that cannot be written is logged, not fatal: this
    process's futures work, a restart then answers its ids 404 instead of future_lost."""
    if ledger is None:
        return
    try:
        ledger.parent.mkdir(parents=True, exist_ok=True)
        with ledger.open("a") as f:
            f.write(f"{boot}\n")
    except OSError as exc:
        log.warning("cannot record this process's request ids in %s: %s", ledger, exc)


__all__ = ["REQUEST_ID", "FutureTable", "Outcome", "UserError"]
