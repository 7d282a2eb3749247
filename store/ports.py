"""A loopback port for a child process that must be told its port: one that keeps its port across
restarts (a vLLM server, a test's server killed and started again), or cannot bind port 0 and say which it
got (PostgreSQL, MLflow). A run's own servers bind port 0 and announce the port (`swarm.children.wait_announced`).

Stdlib only: the suites that run in venvs without roost (tests/kit/full_install.py) load this file by path.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: the lowest port `free_port` draws: above the well-known and most registered services' ports
PORT_FLOOR = 20000


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a child that must keep one port across restarts (a vLLM server, a
    test's server killed and started again); a run's own servers bind port 0 (`wait_announced`).

    A port from `bind(("", 0))` is one of that range,
    which the kernel also hands to every outgoing connection, so on a busy machine it could be taken
    between this call and the child's bind (CI's servers died of "Address already in use"). Below the range
    only another process choosing a port by number can take it, and a random draw makes that unlikely."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(PORT_FLOOR, low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # in use: draw again
            return port
    with socket.socket() as s:  # every draw was taken (or no room below the range): the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 where it cannot be read)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(low, PORT_FLOOR + 1000)
