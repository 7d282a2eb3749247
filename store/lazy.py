"""Package attributes imported on first use (PEP 562), for packages whose light paths must stay light.

    __getattr__ = lazy_attributes(__name__, {"RunLogger": "store.tracking"})

The first access imports the named module, caches the value in the package's
namespace (later accesses are plain lookups) and returns it. Stdlib only, like
`store.paths`: `store`, `scheduler` and `researcher` share it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package` that resolves the names in `table` (name -> module)."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
