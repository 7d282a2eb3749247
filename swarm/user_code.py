"""The user's own code named on a command line (`--workflow mod:fn`, `--dataset mod:fn`), imported.

One importer for `swarm client` (at start) and `swarm train`'s checks (before anything starts), so both
read a spec alike and say alike what is wrong: the current directory importable as `python -m` makes
it, and any error raised while importing the module (a SyntaxError, a NameError at its top level) is
the problem to report in one line, not a traceback through the CLI.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def load(spec: str) -> tuple[Any, str | None]:
    """`module:attr.sub` -> (the object, None) or (None, what is wrong, in words)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        return None, f"expected module:function, got {spec!r}"
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any error importing user code is the problem to report
        return None, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
    for part in attr.split("."):
        if not hasattr(obj, part):
            return None, f"{module_name!r} has no attribute {attr!r}"
        obj = getattr(obj, part)
    return obj, None
