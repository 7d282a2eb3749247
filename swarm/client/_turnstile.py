"""A deterministic fleet's claims in hand-out order, one at a time (`FleetConfig.deterministic`).

Jobs are handed out in dataset order, but with many threads their claims race: the thread
holding task 17 may reach the server before the one holding task 16, and then a window of B
groups admits 17 and leaves 16 for the next step. Which tasks form step k would follow
timing. Through the turnstile each job's first claim waits until every job handed out before it
has had its answer (a granted claim; a refusal is waited out inside the claim, by the server's
long poll), so window k admits the dataset's tasks in order. Only claims are serialized:
workflows still run concurrently. A job's later attempts (after a workflow failure) claim
without waiting: their group is already admitted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Turnstile:
    """Tickets in hand-out order; `turn(ticket)` lets one ticket through at a time, in order."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._issued = 0
        self._next = 0

    def ticket(self) -> int:
        """The next ticket (call where jobs are handed out, under the same lock, so tickets follow jobs)."""
        with self._cond:
            ticket = self._issued
            self._issued += 1
            return ticket

    @contextmanager
    def turn(self, ticket: int, stop: threading.Event | None = None) -> Iterator[bool]:
        """Wait for `ticket`'s turn (True), or until `stop` is set (False: go on, the fleet is ending);
        the next ticket's turn comes when the block ends, whether it claimed, failed or gave up."""
        with self._cond:
            while self._next < ticket and not (stop is not None and stop.is_set()):
                self._cond.wait(0.2)
            mine = self._next == ticket
        try:
            yield mine
        finally:
            with self._cond:
                if self._next == ticket:  # (stopped before its turn: the later tickets stop too)
                    self._next += 1
                    self._cond.notify_all()


__all__ = ["Turnstile"]
