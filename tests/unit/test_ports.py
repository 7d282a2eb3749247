"""`store.ports.free_port`: a port a child is told (PostgreSQL, MLflow, a server restarted on its port)."""

from __future__ import annotations

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
        draws = iter([taken, taken, taken + 1 if taken + 1 < 65536 else taken - 1])
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda self, a, b: next(draws))
        port = free_port()
    assert port != taken
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # it is free
