"""`researcher`'s progress on a terminal: a spinner names the graph's work under way (a planner's LLM call can
take a minute that showed nothing) and is gone when the step ends, an interrupt's included."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from researcher import cli_output
from researcher.cli_output import Progress
from researcher.runner import Step


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(cli_output, "console", Console(file=out, force_terminal=True, color_system=None, width=100))
    return out


def test_the_spinner_names_the_work_and_ends_with_the_step(terminal: io.StringIO) -> None:
    progress = Progress()
    progress.node("monitor")  # only looks: no spinner
    assert progress.status is None
    progress.node("frame")
    progress.node("hypothesize")
    assert progress.status is not None
    progress(Step("waiting", {"running": 2, "pending": 4}))
    assert progress.status is None  # stopped before the counts are printed
    shown = terminal.getvalue()
    assert "stating the hypothesis…" in shown and "trials running 2, pending 4" in shown


def test_an_interrupt_stops_the_spinner(terminal: io.StringIO) -> None:
    with pytest.raises(KeyboardInterrupt), Progress() as progress:
        progress.node("analyze")
        assert progress.status is not None
        raise KeyboardInterrupt
    assert progress.status is None and "analysing the results…" in terminal.getvalue()
