"""The admission gate between generation and the exclusive work on the vLLM server.

A weight sync must not swap the weights under a request (its tokens would mix two
policies), and a restart must not receive new requests. So every request enters
this gate and leaves it when done; a sync *drains* it (new requests wait, those in
flight finish, or are aborted after a timeout) and a restart *holds* it (new
requests wait). While a drain aborts, `aborting` is set: a stream that reads it ends
itself (one policy's requests on a vLLM that serves several, swarm/engine/vllm/policies.py).
It is the one piece of state the stream client, the weight publisher and the supervisor
share, so it lives apart from all three. Async callers wait by
polling so that the event loop is never blocked on the lock of a thread-side sync.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DrainGate:
    """Counts requests in flight; `drain`/`hold` stop new ones entering until `reopen`."""

    def __init__(self, poll_s: float = 0.02) -> None:
        self._cond = threading.Condition()
        self._poll_s = poll_s
        self.draining = False
        self.in_flight = 0
        #: a drain timed out and is ending the requests in flight: streams that watch it end at their next chunk
        self.aborting = False

    async def enter(self, label: Callable[[], T]) -> T:
        """Wait (without blocking the event loop) until the gate is open, enter, and return `label()`
        read at entry: what the request is labelled with (the weights' version) cannot change until it leaves."""
        while True:
            with self._cond:
                if not self.draining:
                    self.in_flight += 1
                    return label()
            await asyncio.sleep(self._poll_s)

    def enter_blocking(self, label: Callable[[], T] = lambda: None) -> T:  # type: ignore[assignment,return-value]
        """`enter` for a thread."""
        with self._cond:
            self._cond.wait_for(lambda: not self.draining)
            self.in_flight += 1
            return label()

    def leave(self) -> None:
        with self._cond:
            self.in_flight -= 1
            self._cond.notify_all()

    def hold(self) -> None:
        """Stop new requests entering; those in flight go on (a restart ends them by itself)."""
        with self._cond:
            self.draining = True

    def drain(self, timeout_s: float, on_timeout: Callable[[int], None], abort_wait_s: float = 60.0) -> float:
        """Hold, then wait until no request is in flight; returns the seconds it took.

        If requests are still running after `timeout_s`, `on_timeout(n)` is called (outside the
        lock, so those requests can leave) to end them, and the wait goes on up to `abort_wait_s`.
        """
        t0 = time.perf_counter()
        with self._cond:
            self.draining = True
            if not self._cond.wait_for(lambda: self.in_flight == 0, timeout=timeout_s):
                running = self.in_flight
                self.aborting = True
                self._cond.release()
                try:
                    on_timeout(running)
                finally:
                    self._cond.acquire()
                try:
                    self._cond.wait_for(lambda: self.in_flight == 0, timeout=abort_wait_s)
                finally:
                    self.aborting = False
        return time.perf_counter() - t0

    def reopen(self) -> None:
        """Let waiting and new requests in again."""
        with self._cond:
            self.draining = False
            self._cond.notify_all()
