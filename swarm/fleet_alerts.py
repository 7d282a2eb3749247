"""What a run's client fleets say about the user's workflow, shown by `swarm train` as it happens.

A workflow that raises, or returns None without finishing its episode, costs its episodes (aborted,
never trained), and the run goes on: with only the reward curve to look at, a user could train for an
hour on the third of the episodes that did not fail without knowing. The fleet prints the first failure
of each kind once, with its traceback, into its log (swarm/client/_fleet.py); `FleetAlerts` reads
those logs as they grow and hands back one line per such failure for the driver to print, pointing
at the log for the traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from swarm.children import NONE_RETURNED, WORKFLOW_FAILED

#: where this run's part of a client log starts (`open_log` writes it): earlier parts were shown before
PART_HEADER = b"--- swarm train at "


class FleetAlerts:
    """New failure lines of the fleets' logs, read incrementally (only the bytes appended since the last
    poll; a line still being written waits for the next)."""

    def __init__(self, logs: Iterable[Path]) -> None:
        self.offsets: dict[Path, int | None] = dict.fromkeys(logs)  # None: not read yet

    def poll(self) -> list[str]:
        out: list[str] = []
        for path, offset in self.offsets.items():
            try:
                with path.open("rb") as f:
                    data = f.read() if offset is None else (f.seek(offset), f.read())[1]
            except OSError:
                continue
            if offset is None:  # the first read: this run's part only
                start = data.rfind(PART_HEADER)
                offset, data = max(start, 0), data[max(start, 0) :]
            end = data.rfind(b"\n") + 1
            self.offsets[path] = offset + end
            for line in data[:end].decode("utf-8", "replace").splitlines():
                out += self._read(path, line)
        return out

    def say(self, console: Console) -> None:
        """Print the new failure lines as warnings (a driver calls it while it follows the run, and once
        more after its fleets stopped: a short run can end before a failure's line was read)."""
        for line in self.poll():
            console.print(f"[yellow]warning[/yellow]: {escape(line)}", soft_wrap=True)

    @staticmethod
    def _read(path: Path, line: str) -> list[str]:
        """A failure's first line says the exception (its traceback follows, for the log); a None return's
        line is all of it."""
        if line.startswith(WORKFLOW_FAILED):
            return [f"{path.name}: {line.strip()} (the traceback: {path})"]
        if line.startswith(NONE_RETURNED):
            return [f"{path.name}: {line.strip()}"]
        return []


def run_failures(out: Path) -> list[str]:
    """The failure lines of a run's part so far (`out/logs/client*.log`), for its summary.json: a run whose
    workflow failed on a third of its episodes should not read like a clean one there either."""
    return FleetAlerts(sorted((out / "logs").glob("client*.log"))).poll()
