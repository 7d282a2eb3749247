"""`--help` wraps to the terminal: typer kept the single line breaks of a docstring's later paragraphs,
so `swarm eval --help` and `swarm train --help` came out ragged (store/help_text.py)."""

from __future__ import annotations

import pytest
from typer.main import get_command

from store.help_text import unwrapped


def test_paragraphs_are_joined_but_those_laid_out_on_purpose() -> None:
    text = """First line
    goes on.

    A later paragraph
    wrapped in the source.

    \b
    swarm a
    swarm b

    - one
    - two"""
    assert unwrapped(text) == (
        "First line goes on.\n\nA later paragraph wrapped in the source.\n\n\b\nswarm a\nswarm b\n\n- one\n- two"
    )


def _commands(command, path: str):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}")


@pytest.mark.parametrize("module", ["swarm.cli", "researcher.cli", "scheduler.cli"])
def test_no_command_help_breaks_a_paragraph_mid_sentence(module: str) -> None:
    import importlib

    cli = importlib.import_module(module)
    app = cli.full_app() if hasattr(cli, "full_app") else cli.app  # swarm's plugins (sched, db) too
    ragged = {
        path: paragraph
        for path, command in _commands(get_command(app), module)
        for paragraph in (command.help or "").split("\n\n")[1:]
        if "\n" in paragraph and not unwrapped(paragraph) == paragraph
    }
    assert not ragged, ragged


@pytest.mark.parametrize("module", ["swarm.cli", "researcher.cli", "scheduler.cli"])
def test_no_switch_is_labelled_bool(module: str) -> None:
    """typer labels an on/off switch `<bool>`, as if it took a value (`swarm eval --baseline`, `researcher
    study --approve`, `swarm sched status --all` ...), and --help itself."""
    import importlib

    from typer.testing import CliRunner

    cli = importlib.import_module(module)
    app = cli.full_app() if hasattr(cli, "full_app") else cli.app
    labelled = {}
    for path, command in _commands(get_command(app), ""):
        if getattr(command, "hidden", False):
            continue
        r = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
        assert r.exit_code == 0, (path, r.output)
        lines = [line for line in r.output.splitlines() if "<bool>" in line]
        if lines:
            labelled[path] = lines
    assert not labelled, labelled
