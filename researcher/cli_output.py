"""What the `researcher` CLI prints: a plan, a waiting study's progress, where its report is, and the
HTML report exported where the user works (researcher/cli.py has the commands).

Only rich and the standard library at import: the study machinery these functions read (the graph,
the runner, the report) is the `research` extra's, imported inside them once the command has
checked for it.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.table import Table

if TYPE_CHECKING:
    from researcher.config import StudyConfig
    from researcher.plan_steps import FirstRound
    from researcher.runner import Step

console = Console()


def print_plan(cfg: StudyConfig, plan: FirstRound) -> None:
    from researcher.report import planner_description  # lazy: research extra (checked by require_research)

    frame, hyp, design = plan.frame, plan.hypothesis, plan.design
    console.print(f"[bold]Planner:[/] {escape(planner_description(cfg))}")
    console.print(f"[bold]Question:[/] {escape(frame.question)}")
    console.print(f"[bold]Task:[/] {frame.task}   [bold]Metric:[/] {frame.metric} ({frame.metric_description()})")
    console.print(f"[bold]Hypothesis:[/] {escape(hyp.statement)} (direction: {hyp.direction})")
    t = Table("arm", "knobs", "seeds", "steps", title=f"Design (baseline: {escape(design.baseline)})")
    for a in design.arms:
        t.add_row(
            escape(a.name),
            escape(json.dumps({**design.common, **a.knobs})),
            escape(str(design.seeds)),
            str(design.steps),
        )
    console.print(t)
    console.print(f"{len(design.trial_configs())} trials")
    if plan.note:
        console.print(f"[yellow]{escape(plan.note)}[/]")


#: what a terminal's spinner says while a node of the study's graph runs (a planner's LLM call, the analysis
#: and the report can each take a while); `monitor` and `approve` only look and wait
NODE_WORK = {
    "frame": "framing the question",
    "hypothesize": "stating the hypothesis",
    "design": "designing the ablation",
    "launch": "launching trials",
    "analyze": "analysing the results",
    "decide": "deciding what next",
    "report": "writing the report",
}


class Progress:
    """Prints a waiting study's trial counts when they change, not on every poll (one per drive); on a
    terminal, a spinner names the graph's work under way (`node`), gone once the step ends."""

    def __init__(self) -> None:
        self.last = ""
        self.status: Status | None = None

    def node(self, name: str) -> None:
        work = NODE_WORK.get(name)
        if work is None:
            return
        if self.status is None:
            self.status = console.status("")
            self.status.start()
        self.status.update(f"{work}…")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.done()  # an interrupt or an error too: the terminal's cursor comes back

    def done(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def __call__(self, step: Step) -> None:
        self.done()
        if step.state == "waiting" and step.detail.get("running") is not None:
            line = f"trials running {step.detail.get('running')}, pending {step.detail.get('pending')}"
            if line != self.last:
                self.last = line
                console.print(f"[dim]{datetime.now().strftime('%H:%M:%S')} {line}[/]")


def finish(study_id: int, step: Step, out: Path | None = None) -> None:
    if step.state == "approval":
        d = step.detail
        console.print(
            f"[bold yellow]Study {study_id} awaits approval[/] of round {d.get('round', 0) + 1} "
            f"({d.get('planner', '?')} planner): {escape(str(d.get('hypothesis')))}"
        )
        for a in d.get("design", {}).get("arms", []):
            console.print(f"  arm {escape(a['name'])}: {escape(str(a['knobs']))} × seeds {d['design']['seeds']}")
        if d.get("note"):
            console.print(f"  [yellow]{escape(d['note'])}[/]")
        console.print(f"Approve with: researcher approve {study_id}   (or: researcher stop {study_id})")
    elif step.state in ("done", "inactive"):
        show_report_path(study_id, out)


def shown(path: Path) -> str:
    """A path as the user typed it: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def export_html(study_id: int, out: Path | None = None) -> Path:
    """The study's HTML report copied to OUT/report.html (default: the study's --out, else
    ./studies/study-N/), where the user works, not only in ROOST_HOME; rendered from the study's
    state first when the study has none yet (unfinished, or reported before the HTML existed).
    KeyError for an unknown study."""
    from researcher.graph import build_graph  # lazy: research extra (checked by the caller)
    from researcher.html_report import FILE_NAME, write  # lazy: research extra (checked by the caller)
    from researcher.report import copy_report, study_view  # lazy: research extra (checked by the caller)
    from researcher.runner import checkpointer, make_context  # lazy: research extra (checked by the caller)

    ctx = make_context(study_id)
    st = ctx.study()
    if out is None:  # the study's own --out, kept for `resume` and `report --html`; else where the user is
        out = Path(ctx.cfg.report_out) if ctx.cfg.report_out else Path("studies") / f"study-{study_id}"
    dest = out / FILE_NAME
    src = Path(ctx.cfg.study_dir) / "report" / FILE_NAME
    if st.report and src.exists():
        return copy_report(src, out)
    with checkpointer(ctx.engine) as saver:
        snap = build_graph(ctx).compile(checkpointer=saver).get_state({"configurable": {"thread_id": str(study_id)}})
    return write(study_view(ctx, dict(snap.values or {})), dest)


def show_report_path(study_id: int, out: Path | None = None) -> None:
    from researcher.runner import make_context  # lazy: research extra (checked by require_research)
    from store.models import StudyStatus, TrialStatus  # lazy: as above

    ctx = make_context(study_id)
    study = ctx.study()
    color = "red" if study.status == StudyStatus.FAILED.value else "green"
    console.print(
        f"[bold {color}]Study {study_id} {study.status.lower()}[/]; report: {ctx.cfg.study_dir}/report/report.md"
    )
    if study.status == StudyStatus.FAILED.value:  # every trial failed: the first one's reason, not only "failed"
        reasons = [t.config.get("reason") for t in ctx.trials() if t.status == TrialStatus.FAILED.value]
        if reason := next((r for r in reasons if r), None):
            console.print(f"[red]every trial failed[/]; the first: {escape(str(reason))}", soft_wrap=True)
    html = export_html(study_id, out)
    console.print(f"HTML report: {shown(html)} (open it with: researcher report {study_id} --open)", soft_wrap=True)
    if study.report:
        for line in study.report.splitlines():
            if line.startswith("- Round") or line.startswith("- **"):
                console.print(escape(line))


def open_in_browser(path: Path) -> bool:
    """Whether a browser took the file; False where none can (a server, no display)."""
    import webbrowser  # lazy: only --open needs it

    try:
        return webbrowser.open(path.resolve().as_uri())
    except webbrowser.Error:
        return False
