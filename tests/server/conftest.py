"""Fixtures for server tests: a tiny model dir (built once per session) and a server factory."""

from server_fixtures import _close_clients, _roost_home, make_server, model_dir, server

__all__ = ["_close_clients", "_roost_home", "make_server", "model_dir", "server"]
