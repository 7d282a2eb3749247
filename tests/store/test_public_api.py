"""The public surface of `store` is exactly `__all__` (httpx-style)."""

from __future__ import annotations

from types import ModuleType

import store


def test_all_is_sorted_and_complete() -> None:
    assert store.__all__ == sorted(store.__all__)
    defined = {
        name
        for name, value in vars(store).items()
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


def test_importing_store_paths_stays_stdlib_only() -> None:
    """The client and the job wrapper import `store.paths`: it must not drag in the database stack."""
    import subprocess
    import sys

    code = "import sys, store.paths; print(sorted({'sqlmodel', 'sqlalchemy', 'pydantic', 'mlflow'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_schema_state_lives_above_db_and_migrate() -> None:
    """`store.db` knows nothing of migrations (no db <-> migrate loop); `store.schema` joins them."""
    import ast
    from pathlib import Path

    src = Path(store.__file__).with_name("db.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(src)) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Import) for a in node.names}
    assert not any(m and (m.startswith("store.migrate") or m.startswith("store.schema")) for m in imported)
    assert "migrate" not in {
        a.name
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.ImportFrom) and node.module == "store"
        for a in node.names
    }
