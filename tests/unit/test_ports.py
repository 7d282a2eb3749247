"""`store.ports.free_port`: a port a child is told (PostgreSQL, MLflow, a server restarted on its port)."""

from __future__ import annotations

import random
import socket

import pytest

from store import ports
from store.ports import free_port


def test_free_port_is_below_the_ephemeral_range_and_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """An outgoing connection takes its port from the kernel's ephemeral range, so a port drawn there
    could be gone before the child binds it: `free_port` draws below the range, and skips a port in use."""
    low = ports._ephemeral_low()
    drawn = {free_port() for _ in range(20)}
    assert all(ports.PORT_FLOOR <= p < low for p in drawn)
    assert len(drawn) > 1  # drawn at random, not the same port for every caller
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        # the taken port twice, then real draws: a fixed third port (taken + 1 once) can be in use on a
        # busy machine too, and `free_port` must skip it just the same
        draw = ports.random.SystemRandom.randrange
        first, calls = [taken, taken], []

        def scripted(self: random.SystemRandom, a: int, b: int) -> int:
            calls.append(a)
            return first.pop() if first else draw(self, a, b)

        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(ports.random.SystemRandom, "randrange", scripted)
        port = free_port()
    assert len(calls) >= 3  # the taken port was drawn twice and skipped both times
    assert port != taken
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # it is free
