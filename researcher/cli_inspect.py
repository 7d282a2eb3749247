"""The `researcher` commands that read or end a study rather than plan and drive it: `status`, `report`,
`stop`, `daemon` (registered on the app by `researcher.cli`).

As in `researcher.cli`, each checks for the research extra first and imports the study machinery inside:
`researcher --help` works without it.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from researcher.cli_errors import fail, require_research
from researcher.cli_output import console, export_html, open_in_browser, shown
from swarm.output_paths import require_output


def status(study_id: int = typer.Argument(None, show_default="every study")) -> None:
    """List studies, or show one study's trials."""
    require_research()
    from sqlmodel import Session, func, select  # lazy: with the runner

    from store.models import RunSummary, Study, Trial  # lazy: with the runner
    from store.schema import init_db  # lazy: the store alone; the runner's import (langgraph, ~2.5 s) is not needed

    engine = init_db()
    if study_id is not None:  # its trials whose jobs exited since its driver last looked
        from researcher.trials import reconcile_running  # lazy: the scheduler, only for one study

        reconcile_running(engine, study_id)
    with Session(engine) as s:
        if study_id is None:
            studies = s.exec(select(Study).order_by(Study.id)).all()  # type: ignore[arg-type]
            if not studies:
                console.print(f"No studies yet in {escape(str(engine.url))}; start one with: researcher study TOPIC")
                return
            counts = dict(s.exec(select(Trial.study_id, func.count()).group_by(Trial.study_id)).all())  # type: ignore[arg-type]
            t = Table("id", "status", "trials", "question", title="Studies")
            for st in studies:
                t.add_row(str(st.id), st.status, str(counts.get(st.id, 0)), escape(st.question[:80]))
            console.print(t)
            return
        st = s.get(Study, study_id)
        if st is None:  # as report, resume, stop and approve say it
            raise fail(f"no study {study_id}", "list the studies with: researcher status")
        console.print(f"[bold]Study {st.id}[/] {st.status}: {escape(st.question)}")
        trials = s.exec(select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)).all()  # type: ignore[arg-type]
        ids = [tr.id for tr in trials]
        finals = {  # each finished trial's outcome as the analysis reads it (its last steps' mean reward)
            r.trial_id: r.metrics.get("final_reward")
            for r in s.exec(select(RunSummary).where(RunSummary.trial_id.in_(ids))).all()  # type: ignore[union-attr]
        }
        t = Table("trial", "arm", "seed", "status", "final reward", "job", "MLflow run")
        for tr in trials:
            final = finals.get(tr.id)
            t.add_row(
                str(tr.id),
                escape(tr.arm),
                str(tr.seed),
                tr.status,
                f"{final:.3f}" if isinstance(final, int | float) else "–",
                str(tr.config.get("job_id", "–")),
                tr.mlflow_run_id or "–",
            )
        console.print(t)


def known_study(study_id: int) -> str:
    """The study's status; one line and exit 1 for a study the store does not have (not a KeyError traceback)."""
    from sqlmodel import Session  # lazy: with the runner

    from store.models import Study  # lazy: with the runner
    from store.schema import init_db  # lazy: the store alone, not the runner

    with Session(init_db()) as s:
        row = s.get(Study, study_id)
        if row is None:
            raise fail(f"no study {study_id}", "list the studies with: researcher status")
        return row.status


def report(
    study_id: int = typer.Argument(...),
    as_html: bool = typer.Option(
        False, "--html", help="write the self-contained HTML report (see --out) and print its path"
    ),
    open_it: bool = typer.Option(
        False, "--open", help="write the HTML report and open it in a browser (no browser: print its path)"
    ),
    out: Path = typer.Option(
        None,
        "--out",
        show_default="the study's --out, else ./studies/study-N",
        file_okay=False,
        help="folder for report.html",
    ),
) -> None:
    """Print the study's report (for an unfinished study: what it has so far), or write it as HTML."""
    require_research()
    known_study(study_id)
    if as_html or open_it:  # the folder checked before the study is loaded: a traceback from the copy before
        require_output(out, "--out", folder=True)
    from researcher.graph import build_graph  # lazy: research extra (checked above)
    from researcher.report import render  # lazy: research extra (checked above)
    from researcher.runner import checkpointer, make_context  # lazy: research extra (checked above)

    if as_html or open_it:
        path = export_html(study_id, out)
        if not open_it:
            typer.echo(shown(path))
        elif open_in_browser(path):
            typer.echo(f"opened {shown(path)}")
        else:
            typer.echo(f"no browser to open it; the report: {shown(path)}")
        return
    ctx = make_context(study_id)
    st = ctx.study()
    if st.report:
        typer.echo(st.report)
        return
    with checkpointer(ctx.engine) as saver:
        snap = build_graph(ctx).compile(checkpointer=saver).get_state({"configurable": {"thread_id": str(study_id)}})
    typer.echo(render(ctx, dict(snap.values or {}), Path(ctx.cfg.study_dir) / "report"))


def stop(study_id: int = typer.Argument(...)) -> None:
    """Cancel a study's running trials and write a report of what completed."""
    require_research()
    from researcher.runner import StudyEnded, stop_study  # lazy: research extra (checked above)

    known_study(study_id)
    try:
        path = stop_study(study_id)
    except StudyEnded as exc:
        raise fail(str(exc), f"its report: researcher report {study_id}") from None
    console.print(f"study {study_id} stopped; report: {path}")


def daemon(
    interval: float = typer.Option(30.0, "--interval", min=0.1, help="seconds between study ticks"),
) -> None:
    """Run the scheduler daemon with the researcher's tick: every active study advances."""
    require_research()
    from researcher import daemon as study_daemon  # lazy: research extra (checked above)
    from scheduler import daemon as scheduler_daemon  # lazy: research extra (checked above)

    if (pid := scheduler_daemon.running_daemon()) is not None:  # said before "tick every", not as a traceback
        raise fail(f"a daemon (pid {pid}) already serves this database", "one is enough: it advances every study")
    study_daemon.register(interval)
    console.print(f"researcher tick every {interval:g} s; Ctrl-C stops")
    try:
        scheduler_daemon.run_daemon()  # returns on SIGINT or SIGTERM, once its threads have stopped
    except scheduler_daemon.DaemonAlreadyRunning as exc:  # one started between the check and the lock
        raise fail(str(exc), "one is enough: it advances every study") from None
    console.print("daemon stopped: running trials go on; active studies wait for the next `researcher daemon`")
