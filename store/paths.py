"""Where Roost keeps its files: one data directory, overridable by ROOST_HOME.

The ground floor of the project's imports: stdlib only, so every package (the
client included, which has none of the store's dependencies) may import it.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The project's data directory (models, runs, databases).

    `ROOST_HOME` wins; otherwise `$XDG_CACHE_HOME/roost` or `~/.cache/roost`.
    """
    env = os.environ.get("ROOST_HOME")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(base) / "roost").resolve()


def default_model_dir() -> Path:
    return data_dir() / "models" / "tiny-qwen2"
