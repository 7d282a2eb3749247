"""`--help` of the config-derived commands reads at a normal terminal width.

The options of `swarm train` (81 of them) come from four config models; one block
of them squeezed every description into a sliver, cut defaults off and labelled
on/off switches `<bool>`. These pin the grouped, readable layout.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from swarm.cli import app

PANELS = {
    "train": ["run", "task and fleet", "server", "training", "engine: vLLM", "engine: verl"],
    "serve": ["server", "training", "engine: vLLM", "engine: verl"],
    "client": ["task and fleet"],
}


def _help(command: str, columns: int = 120) -> str:
    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": str(columns), "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    return r.output


def _panels(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^╭─ (.*?) ─", text, flags=re.MULTILINE)]


@pytest.mark.parametrize("command", sorted(PANELS))
def test_options_are_grouped_in_panels_in_order(command: str) -> None:
    panels = [p for p in _panels(_help(command)) if p != "Options"]
    assert panels == PANELS[command]


@pytest.mark.parametrize("command", sorted(PANELS))
def test_on_off_flags_show_both_names_and_no_bool(command: str) -> None:
    text = _help(command)
    labelled = [line for line in text.splitlines() if "<bool>" in line]
    assert not labelled, labelled
    if command != "client":
        merge = [line for line in text.splitlines() if re.search(r"│ --merge\b", line)]
        assert merge and "--no-merge" in merge[0], merge


@pytest.mark.parametrize("command", sorted(PANELS))
def test_no_help_text_is_cropped(command: str) -> None:
    text = _help(command)
    assert "…" not in text, [line for line in text.splitlines() if "…" in line]


def test_train_help_gives_descriptions_room_and_cuts_no_default() -> None:
    text = _help("train")
    flat = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))
    assert "ROOST_HOME/models/tiny-qwen2" in flat  # the --model default, whole
    lease = next(line for line in text.splitlines() if "--lease-seconds" in line)
    assert "episode lease: the SDK heartbeats every third of it" in lease, lease  # >= 50 columns of prose
    assert len(text.splitlines()) < 260, len(text.splitlines())  # one screenful per panel, not a wall


def test_researcher_study_help_is_grouped_and_shows_no_bool() -> None:
    """`researcher study`'s 30 options were one block whose names column left the descriptions ~18 columns
    at a normal terminal, labelled every switch `<bool>` and cropped text."""
    from researcher.cli import app as researcher_app

    r = CliRunner().invoke(researcher_app, ["study", "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    assert _panels(r.output) == ["Arguments", "Options", "budget", "design", "running"]
    assert [line for line in r.output.splitlines() if "<bool>" in line] == []
    assert "…" not in r.output
