"""The public surface of `store` is exactly `__all__` (httpx-style)."""

from __future__ import annotations

from types import ModuleType

import store


def test_all_is_sorted_and_complete() -> None:
    assert store.__all__ == sorted(store.__all__)
    defined = {
        name for name, value in vars(store).items()
        if not name.startswith("_") and not isinstance(value, ModuleType) and name != "annotations"
    }
    assert defined <= set(store.__all__)
    for name in store.__all__:
        assert getattr(store, name) is not None, name


def test_importing_store_does_not_import_mlflow() -> None:
    import subprocess
    import sys

    code = "import sys, store; store.Job; print('mlflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
