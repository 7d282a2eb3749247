"""The client SDK must run on machines without torch: importing it never loads torch."""

from __future__ import annotations

import subprocess
import sys

import swarm.client


def test_client_imports_without_torch_or_transformers() -> None:
    code = ("import sys, swarm.client, swarm.client.cli, swarm.protocol; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_public_api_is_exactly_all() -> None:
    public = sorted(n for n in vars(swarm.client) if not n.startswith("_") and n not in {"annotations"}
                    and not isinstance(getattr(swarm.client, n), type(swarm)))
    assert sorted(swarm.client.__all__) == swarm.client.__all__ == public


def test_client_imports_skip_the_store_and_openai() -> None:
    """The two lazy imports in the SDK are there for this: `store` (SQLAlchemy) and `openai` load on use."""
    code = ("import sys, swarm.client, swarm.client.cli; "
            "bad = [m for m in ('sqlalchemy', 'sqlmodel', 'openai') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
