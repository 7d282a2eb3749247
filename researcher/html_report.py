"""The study report as one self-contained HTML file: figures inline (SVG), no network, no files beside it.

    <study dir>/report/report.html        (beside report.md; uploaded with it to MLflow)
    ./studies/study-N/report.html          (`researcher study` / `researcher report N --html`; or --out DIR)

Why a second format: the markdown needs a viewer and its PNGs beside it, while one HTML file can be
mailed, attached or opened from MLflow's artifact view as it is. It shows what a reader needs to
trust a verdict: the plan, each round and why it was chosen, reward curves with 95 % bands, a
forest plot of the effects with Holm-adjusted intervals, every seed's score, the test used
(paired or Welch) and why, the verdict rule, and what early stopping saved.

The renderer is pure: `researcher.report.study_view` hands it the markdown report's own
sentences and the analysis' numbers (`StudyView`), so the two formats cannot disagree.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from researcher.analysis import MAX_WINDOW, WINDOW_FRACTION
from researcher.report_figures import curves_svg, forest_svg, holm_intervals, seeds_svg
from store.plots import History, align_seeds

FILE_NAME = "report.html"

STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .5em}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}figcaption{font-size:.85em;color:#555}
.verdict{font-weight:bold;text-transform:uppercase}.supported{color:#1a7f37}.refuted{color:#b42318}
.reason,.rule{background:#f6f8fa;border-left:4px solid #8c959f;padding:.5em .8em}
code{background:#f3f3f3;padding:0 .2em}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dt{font-weight:bold}dd{margin:0}
"""


#: under each trials table (Markdown and HTML): a trial's own summary.json averages another window, and
#: users compared the two
FINAL_REWARD_NOTE = (
    f"*Final reward*: the mean reward of a trial's last {WINDOW_FRACTION:.0%} of steps (1 to {MAX_WINDOW}), "
    "as the analysis scores it; the trial run's summary.json `reward_last_mean` averages its last "
    f"`reward_window` steps (up to {MAX_WINDOW}, at most half the run), so the two can differ."
)


@dataclass
class RoundView:
    """One analysed round, as the markdown report words it."""

    number: int
    statement: str
    reason: str
    verdict: str
    planner: str
    design: dict[str, Any]
    analysis: dict[str, Any]
    conclusions: list[str]
    methods: list[str]
    rule: str
    notes: str = ""
    design_note: str = ""
    curves: dict[str, list[History]] = field(default_factory=dict)


@dataclass
class StudyView:
    """Everything the HTML report shows; built by `researcher.report.study_view`."""

    study_id: int
    question: str
    frame: dict[str, Any]
    planner: str
    facts: list[tuple[str, str]]
    stop_reason: str
    rounds: list[RoundView]
    early_stop: dict[str, float] | None
    trials: list[dict[str, Any]]
    #: (round number, design) of a round planned and not analysed: a running study's report shows it, a stopped
    #: one's marks it "not analysed"
    running: tuple[int, dict[str, Any]] | None = None


def inline(text: str) -> str:
    """The markdown report's inline marks (**bold**, *italic*, `code`) as HTML, everything else escaped."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", out)


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return str(x) if math.isnan(x) or math.isinf(x) else f"{x:.{digits}f}"
    return html.escape(str(x))


def _p(p: Any) -> str:
    return "–" if p is None else ("&lt; 0.001" if p < 0.001 else f"{p:.3f}")


def _table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    th = "".join(f"<th>{h}</th>" for h in head)
    cell = lambda i, c: f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"  # noqa: E731
    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _plan(view: StudyView) -> str:
    f = view.frame
    items = [
        ("Question", html.escape(f.get("question", view.question))),
        ("Task", f"<code>{html.escape(str(f.get('task', '?')))}</code>"),
        ("Metric", html.escape(f"{f.get('metric', '?')} (window {f.get('metric_window', '?')})")),
        ("Knobs studied", html.escape(", ".join(f.get("knobs", [])) or "–")),
        ("Planner", inline(view.planner)),
    ]
    rows = []
    planned = [(str(r.number), r.design) for r in view.rounds]
    if view.running is not None:
        planned.append((f"{view.running[0]} ({'not analysed' if view.stop_reason else 'running'})", view.running[1]))
    for number, d in planned:
        for a in d["arms"]:
            knobs = {**d.get("common", {}), **a["knobs"]}
            role = "baseline" if a["name"] == d["baseline"] else "treatment"
            rows.append(
                [
                    number,
                    html.escape(a["name"]),
                    role,
                    f"<code>{html.escape(str(knobs))}</code>",
                    html.escape(str(d["seeds"])),
                    str(d["steps"]),
                ]
            )
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    head = ["round", "arm", "role", "knobs", "seeds", "steps"]
    table = _table(head, rows) if rows else "<p>No round was planned.</p>"
    return f'<section id="plan"><h2>The plan</h2><dl>{dl}</dl>{table}</section>'


def _round(r: RoundView) -> str:
    res = r.analysis
    n = r.number
    verdict = html.escape(r.verdict)
    parts = [
        f'<section id="round-{n}" class="round"><h2>Round {n}: {html.escape(r.statement)}</h2>',
        f'<p class="reason"><strong>Why this round:</strong> {inline(r.reason or "the planner gave no reason")}</p>',
        f'<p>Verdict: <span class="verdict {verdict.split()[0]}">{verdict}</span> '
        f"(α = {res.get('alpha', 0.05)}, expected direction of treatment − baseline: "
        f"{html.escape(str(res.get('direction')))}; planned by the {html.escape(r.planner)} planner)</p>",
        "<ul>" + "".join(f"<li>{inline(c)}</li>" for c in r.conclusions) + "</ul>",
    ]
    if r.design_note:
        parts.append(f"<p><strong>{inline(r.design_note)}</strong></p>")
    methods = "".join(f"<p>{inline(m)}</p>" for m in r.methods) or "<p>No comparison was tested.</p>"
    parts.append(f'<section id="round-{n}-analysis"><h3>Analysis used</h3>{methods}</section>')
    if r.curves:
        parts.append(
            _figure(
                curves_svg(r.curves, f"round-{n}-reward-curves"),
                "Reward per step of each arm: mean over seeds with its 95 % t-interval band.",
            )
        )
    if res.get("comparisons"):
        parts.append(
            _figure(
                forest_svg(res, f"round-{n}-forest"),
                "Treatment − baseline: the difference (dot), its 95 % "
                "interval (thin) and the interval at the level Holm tested it at (thick); dashed: no effect.",
            )
        )
    if res.get("arms"):
        parts.append(
            _figure(
                seeds_svg(res, f"round-{n}-per-seed"),
                "Each seed's score (grey) and the arm's mean with its 95 % t-interval.",
            )
        )
    parts.append(f"<h3>Per arm: {html.escape(str(res.get('metric_description', res.get('metric', ''))))}</h3>")
    parts.append(
        _table(
            ["arm", "n", "mean", "95 % t-interval", "SD", "per-seed values"],
            [
                [
                    html.escape(name),
                    str(a["n"]),
                    _num(a["mean"]),
                    f"[{_num(a['ci_low'])}, {_num(a['ci_high'])}]",
                    _num(a["std"]),
                    ", ".join(_num(v) for v in a["values"]),
                ]
                for name, a in res.get("arms", {}).items()
            ],
            {1, 2, 4},
        )
    )
    adjusted = holm_intervals(res)
    rows = []
    for c in res.get("comparisons", []):
        adj = adjusted.get(c["arm"])
        rows.append(
            [
                html.escape(f"{c['arm']} vs {c['baseline']}"),
                html.escape(c.get("method", "welch")),
                _num(c["diff"]),
                f"[{_num(c['diff_ci_low'])}, {_num(c['diff_ci_high'])}]",
                f"[{_num(adj[0])}, {_num(adj[1])}]" if adj else "–",
                _p(c["p"]),
                _p(c.get("p_holm")),
                html.escape(c["verdict"] + (" (stopped early)" if c.get("stopped") else "")),
            ]
        )
    parts.append("<h3>Comparisons with the baseline</h3>")
    parts.append(
        _table(["comparison", "test", "diff", "95 % CI", "Holm-adjusted CI", "p", "Holm p", "verdict"], rows, {2, 5, 6})
    )
    parts.append(f'<p class="rule" id="round-{n}-rule"><strong>Verdict rule.</strong> {inline(r.rule)}</p>')
    if r.notes:
        parts.append(f"<p><strong>Planner's notes:</strong> {inline(r.notes)}</p>")
    parts.append("</section>")
    return "\n".join(parts)


def _early_stop(view: StudyView) -> str:
    es = view.early_stop
    if es is None:
        return '<section id="early-stopping"><h2>Early stopping</h2><p>No rung was judged.</p></section>'
    return (
        '<section id="early-stopping"><h2>Early stopping</h2>'
        f"<p>Stopping trials early saved <strong>{es['saved_steps']:g} of {es['planned_steps']:g} planned "
        f"trial-steps ({es['saved_fraction']:.0%})</strong>; arms stopped: {es['arms_stopped']:g}.</p></section>"
    )


def render_html(view: StudyView) -> str:
    """The whole report as one HTML document (UTF-8, no external resources)."""
    title = f"Study {view.study_id}: {view.question}"
    facts = "".join(f"<dt>{html.escape(k)}</dt><dd>{inline(v)}</dd>" for k, v in view.facts)
    summary = "".join(
        f'<li><a href="#round-{r.number}">Round {r.number}</a>: {html.escape(r.statement)} → '
        f"<strong>{html.escape(r.verdict)}</strong></li>"
        for r in view.rounds
    )
    if view.rounds and view.rounds[-1].notes:
        summary += f"<li>Why the study ended there: {inline(view.rounds[-1].notes)}</li>"
    stopped = f"<p><strong>Stopped early:</strong> {inline(view.stop_reason)}</p>" if view.stop_reason else ""
    trials = _table(
        ["trial", "arm", "seed", "status", "final reward", "MLflow run", "note"],
        [
            [html.escape(str(t.get(k, "–"))) for k in ("id", "arm", "seed", "status", "final", "run", "note")]
            for t in view.trials
        ],
    )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<dl>{facts}</dl>",
        stopped,
        f'<section id="summary"><h2>Summary</h2><ul>{summary or "<li>No round was analysed.</li>"}</ul></section>',
        _plan(view),
        *(_round(r) for r in view.rounds),
        _early_stop(view),
        f'<section id="trials"><h2>Trials</h2>{trials}<p>{inline(FINAL_REWARD_NOTE)}</p></section>',
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(b for b in body if b)
        + "\n</body></html>\n"
    )


def write(view: StudyView, path: Path) -> Path:
    """Render the report into `path` (its folder created); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(view), encoding="utf-8")
    return path


def arm_curves(view: StudyView) -> dict[str, tuple[list[float], list[float]]]:
    """Each arm's mean reward per step over its seeds, from the last round that ran it (a later
    look pools the earlier seeds): what the study's MLflow run charts as `reward_mean/<arm>`."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for r in view.rounds:
        for arm, hs in r.curves.items():
            grid, values = align_seeds(hs)
            if grid.size:
                out[arm] = ([float(s) for s in grid], [float(v) for v in values.mean(axis=0)])
    return out
