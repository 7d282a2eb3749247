"""`swarm train` says at once when the user's workflow fails (swarm/fleet_alerts.py reads the fleets' logs)."""

from __future__ import annotations

import io
from pathlib import Path

from swarm.fleet_alerts import FleetAlerts

EARLIER = (
    "--- swarm train at 2026-01-01 00:00:00: steps 1..3 ---\nworkflow returned None without finishing the episode (a)\n"
)
FAILURE = """workflow failed (p1 attempt 1; the first of this kind, said once): ValueError: boom
Traceback (most recent call last):
  File "/tmp/mywf.py", line 9, in play
    raise KeyError("x")
KeyError: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/tmp/mywf.py", line 11, in play
    raise ValueError("boom")
ValueError: boom
"""


def test_new_failure_lines_of_this_part_each_once(tmp_path: Path) -> None:
    log = tmp_path / "client0.log"
    log.write_text(EARLIER + "--- swarm train at 2026-01-02 00:00:00: steps 4..6 ---\n  v0 ok 3\n")
    alerts = FleetAlerts([log, tmp_path / "client1.log"])  # a log not there yet is no error
    assert alerts.poll() == []  # the earlier part's line was shown by that part
    with log.open("a") as f:
        f.write(FAILURE[:60])  # half a line: waits for the rest
    assert alerts.poll() == []
    with log.open("a") as f:
        f.write(FAILURE[60:] + "workflow returned None without finishing the episode (p2): it is aborted\n")
    assert alerts.poll() == [
        f"client0.log: workflow failed (p1 attempt 1; the first of this kind, said once): ValueError: boom "
        f"(the traceback: {log})",
        "client0.log: workflow returned None without finishing the episode (p2): it is aborted",
    ]
    assert alerts.poll() == []


def test_a_failure_listed_while_another_is_printed_is_printed_too() -> None:
    """Two fleet threads failing at once (t0 returning None, t1 raising): the one listed while the other's
    line was being printed was counted as printed and never said (CI, under load: one of the two lines)."""
    from rich.console import Console

    from swarm.client._fleet import FleetStats
    from swarm.client.cli import _progress

    stats = FleetStats(first_of_kind=["first"])

    class Racing(Console):  # another thread lists its failure while this one prints
        def print(self, *objects: object, **kwargs: object) -> None:
            super().print(*objects, **kwargs)
            if len(stats.first_of_kind) == 1:
                stats.first_of_kind.append("second")

    console = Racing(file=io.StringIO(), width=200)
    with _progress(console, None, quiet=True) as update:
        update(stats)
        update(stats)
    said = console.file.getvalue()
    assert "first" in said and "second" in said, said
