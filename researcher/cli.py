"""`researcher`: the autonomous study loop (see DESIGN.md §5)."""

import typer

app = typer.Typer(help="Plan, run and report RL studies autonomously (coming: `researcher study TOPIC`).",
                  no_args_is_help=True)


@app.callback()
def _root() -> None:
    """Autonomous RL research on top of the swarm."""


def main() -> None:
    app()
