"""`swarm sched` / `swarm db` come from `roost.cli` entry points (swarm/plugins.py), not from imports."""

from __future__ import annotations

import ast
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import typer
from typer.testing import CliRunner

from swarm.plugins import GROUP, mount_plugins

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, add_completion=False)

    @app.command("serve")
    def serve() -> None:
        """A built-in command."""

    @app.command("client")
    def client() -> None:
        """Another (two commands make `app` a group, as `swarm` is)."""

    return app


def test_entry_points_are_registered() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    assert eps.get("sched") == "scheduler.cli:app" and eps.get("db") == "store.cli:app", (
        f"{eps}: run `pip install -e . --no-deps` to register the entry points"
    )


def test_swarm_sched_and_db_help() -> None:
    from swarm.cli import full_app  # in the test: a broken swarm.cli fails this test, not the module

    app = full_app()

    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0, top.output
    assert "sched" in top.output and "db" in top.output
    sched = runner.invoke(app, ["sched", "--help"])
    assert sched.exit_code == 0, sched.output
    assert all(cmd in sched.output for cmd in ("submit", "status", "cancel", "logs", "daemon"))
    db = runner.invoke(app, ["db", "--help"])
    assert db.exit_code == 0, db.output
    assert all(cmd in db.output for cmd in ("upgrade", "downgrade", "current", "check"))


def test_swarm_cli_does_not_import_scheduler_or_store_clis() -> None:
    tree = ast.parse((ROOT / "swarm" / "cli.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
    assert not {m for m in imported if m.split(".")[0] in ("scheduler", "store") and "cli" in m}, imported


def test_mount_takes_help_from_each_sub_app() -> None:
    app = _app()
    names = mount_plugins(
        app, [EntryPoint("sched", "scheduler.cli:app", GROUP), EntryPoint("db", "store.cli:app", GROUP)]
    )
    assert names == ["db", "sched"]
    out = runner.invoke(app, ["--help"], terminal_width=200).output
    assert "Jobs on local processes or Slurm" in out and "The project database" in out


def test_broken_plugin_is_reported_not_fatal() -> None:
    app = _app()
    mount_plugins(app, [EntryPoint("gone", "no_such_module_roost:app", GROUP), EntryPoint("odd", "json:dumps", GROUP)])
    assert runner.invoke(app, ["serve"]).exit_code == 0
    r = runner.invoke(app, ["gone", "upgrade", "--url", "x"])
    assert r.exit_code == 1 and "swarm gone: unavailable (ModuleNotFoundError" in r.output
    r = runner.invoke(app, ["odd"])
    assert r.exit_code == 1 and "not a typer.Typer" in r.output


def test_plugin_cannot_shadow_a_builtin() -> None:
    app = _app()
    assert mount_plugins(app, [EntryPoint("serve", "store.cli:app", GROUP)]) == []
    assert runner.invoke(app, ["serve"]).exit_code == 0


def test_builtin_commands_skip_loading_plugins() -> None:
    from swarm.plugins import needs_plugins

    app = _app()
    assert not needs_plugins(app, ["serve", "--port", "8000"]) and not needs_plugins(app, ["client"])
    assert needs_plugins(app, []) and needs_plugins(app, ["--help"]) and needs_plugins(app, ["sched", "status"])


def test_swarm_serve_starts_without_importing_plugins() -> None:
    """A real `python -m swarm serve --help`: no plugin module (SQLAlchemy, Alembic) is imported;
    `swarm --help` still lists the plugins."""
    import subprocess
    import sys

    probe = (
        "import sys, runpy; sys.argv = ['swarm', 'serve', '--help']\n"
        "try:\n    runpy.run_module('swarm', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('store.cli', 'scheduler.cli', 'alembic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "LOADED []" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    top = subprocess.run(
        [sys.executable, "-m", "swarm", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert top.returncode == 0 and "sched" in top.stdout and "db" in top.stdout, top.stdout + top.stderr
