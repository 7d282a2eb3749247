"""Fixtures for server tests: a tiny model dir (built once per session) and a server factory."""

import sys
from pathlib import Path

# the shared kit (tests/kit) imports by name under --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kit"))

from server_fixtures import _close_clients, _roost_home, make_server, model_dir, server  # noqa: E402

__all__ = ["_close_clients", "_roost_home", "make_server", "model_dir", "server"]
