"""Typed events between the server's components: a publisher, listeners registered once.

    trainer.window_reopened.subscribe(durability.refill)      # wiring, in `Swarm.__init__`
    trainer.window_reopened.publish(policy_version)           # the trainer, after each step

A component that has news (the trainer finished a step, the lease sweeper freed
slots) publishes it on a `Topic` it owns; `Swarm` subscribes the components that
care, in the order they must run. Nobody swaps another object's callbacks, and a
publisher never learns who listens.

`Topic` is for notifications: each listener runs in turn, and one that raises is
logged while the others still run (a listener's bug never stops the trainer).
`StepTopic` is for work that belongs to an optimisation step (the checkpoint
after it): listeners are awaited in order and a failure propagates, so the step
counts as failed.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, ParamSpec

log = logging.getLogger("swarm.server")
P = ParamSpec("P")


class Topic(Generic[P]):
    """One kind of event; `publish(*args)` calls every listener with those arguments."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._listeners: list[Callable[P, Any]] = []

    def subscribe(self, listener: Callable[P, Any]) -> None:
        self._listeners.append(listener)

    def publish(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self._listeners:
            try:
                listener(*args, **kwargs)
            except Exception:
                log.exception("a listener of %r failed", self.name)


class StepTopic(Generic[P]):
    """Like `Topic`, but listeners may be coroutines, are awaited in order, and failures propagate."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._listeners: list[Callable[P, Awaitable[None] | None]] = []

    def subscribe(self, listener: Callable[P, Awaitable[None] | None]) -> None:
        self._listeners.append(listener)

    async def publish(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self._listeners:
            result = listener(*args, **kwargs)
            if inspect.isawaitable(result):
                await result
