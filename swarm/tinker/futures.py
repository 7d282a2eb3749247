"""Tinker's futures: every training or sampling request answers a `request_id` at once, its result
is fetched with `retrieve_future`, and the requests of one model run one at a time in the order
they were accepted (Tinker's promise: a forward_backward, then the optim_step sent after it).

    table = FutureTable()
    rid = table.submit(lane="model-1", work=lambda: compute(...))     # runs after lane's earlier work
    outcome = await table.wait(rid, timeout=20)                       # None: still running

A request id carries the id of the server process that issued it (`boot`): a future asked for
after a restart (kill -9, crash) is unknown to the new process, which then answers with an error
the SDK raises (`RequestFailedError`: "the server restarted ...") instead of letting it poll
forever. Results are kept in memory only: what must outlive a crash is a saved state on disk.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("swarm.tinker")

KEPT = 4096  # finished results kept for retrieval (an SDK fetches each once, soon after it is done)


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
    """Futures by request id, and one ordered lane of work per model."""

    def __init__(self) -> None:
        self.boot = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._done: OrderedDict[str, Outcome] = OrderedDict()
        self._events: dict[str, asyncio.Event] = {}
        self._lanes: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def new_id(self) -> str:
        return f"{self.boot}-{next(self._ids)}"

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

        An id of another server process, or one long forgotten, is an error outcome at once."""
        if rid in self._done:
            return self._done[rid]
        event = self._events.get(rid)
        if event is None:
            boot = rid.split("-", 1)[0]
            if boot != self.boot:
                return Outcome(
                    error=f"future_lost: request {rid} was accepted by a server process that has since "
                    "stopped (restart, kill -9 or crash) before its result was kept; nothing it did after "
                    "the last saved state is durable: load_state the last checkpoint and send it again",
                    category="server",
                )
            return Outcome(error=f"unknown_future: no request {rid} on this server", category="user")
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return None
        return self._done.get(rid)

    async def drain(self) -> None:
        """Let work in flight finish (the server is stopping)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


__all__ = ["FutureTable", "Outcome", "UserError"]
