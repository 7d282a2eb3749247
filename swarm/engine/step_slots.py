"""Turns for the training steps of several policies on one model: up to `slots` at once, or one alone.

    slots = StepSlots(2)
    with slots.step(): ...        # a policy's step: beside up to one other step (and generation)
    with slots.exclusive(): ...   # adding or removing a policy, a step in train mode: nothing beside it

Why: steps of different policies on one base share no state they write (each has its own
adapter, gradients and optimizer; swarm/engine/policies.py), so on a machine with more cores than
one step uses they can run at once. What changes the model itself (peft adding or deleting an
adapter rewrites every LoRA layer and the gradient flags, train mode is the whole model's) must
wait until no step runs, and keeps new steps out until it is done. Callers are served in the order
they came: a waiting `exclusive` goes before steps that arrive after it, so a stream of steps cannot
starve a policy's removal, and a policy that steps back to back cannot starve another's step.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator


class StepSlots:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self._cond = threading.Condition()
        self._running = 0  # steps in their slots
        self._exclusive = False  # an exclusive holder is in
        self._queue: deque[object] = deque()  # callers waiting, first come first served

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @contextlib.contextmanager
    def _turn(self, ready: Callable[[], bool]) -> Iterator[None]:
        """Wait in line until first and `ready`; the body (taking the turn) runs under the same lock, so a
        step that just ended cannot take its slot again before a caller that waited for it."""
        me = object()
        with self._cond:
            self._queue.append(me)
            try:
                self._cond.wait_for(lambda: self._queue[0] is me and ready())
                yield
            finally:
                self._queue.remove(me)
                self._cond.notify_all()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        with self._turn(lambda: not self._exclusive and self._running < self.slots):
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._turn(lambda: not self._exclusive and self._running == 0):
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


__all__ = ["StepSlots"]
