"""The errors the vllm engine's parts raise, in one module so that none imports another for them."""

from __future__ import annotations


class VllmEngineError(RuntimeError):
    """vLLM failed a request or a weight sync (the engine has recovered when this is raised)."""


class ServerStartError(RuntimeError):
    """A supervised server process exited or stayed unhealthy while starting (the message ends with its log)."""
