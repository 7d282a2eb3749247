"""The model a bench runs on when it is given none: the embedded one, else an untrained one of the
same recipe built for the run (a fresh machine, before `swarm model init`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def embedded_or_untrained(tmp: Path, given: Path | None = None, say: Callable[[str], None] | None = None) -> Path:
    """`given`, else ROOST_HOME's embedded model, else a random tiny one built under `tmp` (said by `say`)."""
    from store.paths import default_model_dir  # lazy: ROOST_HOME is read when the bench runs

    model = given or default_model_dir()
    if (model / "config.json").exists():
        return model
    from swarm.model.build import build_untrained  # lazy: torch and transformers

    if say is not None:
        say(f"no embedded model at {model}; building a random tiny one")
    return build_untrained(tmp / "model", seed=0)
