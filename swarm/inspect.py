"""`swarm inspect`: look at a recorded episode token by token, after the fact.

    swarm inspect runs/train/server                             # the last episode, in the terminal
    swarm inspect runs/train/server --episode EP_ID --html episode.html   # one episode, also as HTML
    swarm inspect runs/train/server --list --filter 'reward>0' --filter task_family=arith
    swarm inspect runs/train/server --filter 'calls>=3'         # the last episode with 3+ calls

Reads the server's rollout log (`OUT/rollouts.jsonl`: one finished episode per
line with its calls as token ids), merges it exactly as training did, and shows
every token with its text, id, loss mask, rollout logprob and agent. Trained
tokens are green (brighter = more likely under the policy that sampled them);
context tokens are grey. Each sample shows the reward it trained with: in a
group-call episode (one call with n choices, `choice_rewards`) that is its
choice's own reward, in a team episode its agent's (`agent_rewards`), so the
wrong choices are marked instead of all carrying the episode's mean.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from store.paths import default_model_dir
from swarm.config.options import require_extra
from swarm.output_paths import require_output, write_output
from swarm.run_layout import role_folders
from swarm.timeline import Call, Segment, merge, merge_stats

ROLLOUTS = "rollouts.jsonl"


def rollout_log(run_dir: Path) -> Path:
    """The rollout log of a server's `--out` folder, a `swarm train` run folder (its `server/`), or
    the file itself. A run that wrote several (a policy or a team role each) names them instead."""
    if not run_dir.is_dir():
        if run_dir.exists():
            return run_dir
        raise FileNotFoundError(f"{run_dir} does not exist")
    for folder in (run_dir, run_dir / "server"):
        if (folder / ROLLOUTS).is_file():
            return folder / ROLLOUTS
    logs = sorted(folder for folder in role_folders(run_dir) if (folder / ROLLOUTS).is_file())
    if logs:
        raise FileNotFoundError(
            f"{run_dir} holds {len(logs)} rollout logs, one per policy or server: inspect one of "
            + ", ".join(str(p) for p in logs)
        )
    raise FileNotFoundError(
        f"no rollout log in {run_dir} (give a `swarm train --out` or `swarm serve --out` folder, or its {ROLLOUTS})"
    )


class NoEpisode(KeyError):
    """No recorded episode is the one asked for. A KeyError, as before, that prints its message as it
    is (a KeyError's own str() is the repr of its message: quotes around a sentence)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def iter_episodes(run_dir: Path, unreadable: list[int] | None = None) -> Iterator[dict]:
    """The episodes of the rollout log, in the order they finished. A line that is no JSON object (a torn
    last line after a crash, a corrupt one) is skipped, its number added to `unreadable`: a reader
    told "no episode" must be able to learn that the log held lines it could not read."""
    path = rollout_log(run_dir)
    with path.open(errors="replace") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                ep = json.loads(line)
            except json.JSONDecodeError:
                ep = None
            if isinstance(ep, dict):
                yield ep
            elif unreadable is not None:
                unreadable.append(number)


def unreadable_note(run_dir: Path, lines: list[int]) -> str:
    """`2 lines of OUT/rollouts.jsonl skipped as unreadable (lines 4, 9)`: what `iter_episodes` skipped."""
    shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
    many = len(lines) > 1
    return (
        f"{len(lines)} line{'s' if many else ''} of {rollout_log(run_dir)} skipped as unreadable "
        f"(line{'s' if many else ''} {shown})"
    )


_OPS: dict[str, Callable[[object, str], bool]] = {
    ">=": lambda a, b: _num(a) >= float(b),
    "<=": lambda a, b: _num(a) <= float(b),
    "!=": lambda a, b: str(a) != b,
    ">": lambda a, b: _num(a) > float(b),
    "<": lambda a, b: _num(a) < float(b),
    "~": lambda a, b: b in str(a),
    "=": lambda a, b: str(a) == b,
}
FIELDS = ("episode_id", "task_id", "task_family", "group_id", "reward", "status", "policy_version", "calls")


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _field(ep: dict, key: str) -> object:
    return len(ep.get("calls", ())) if key == "calls" else ep.get(key)


def parse_filter(text: str) -> Callable[[dict], bool]:
    """`reward>0.5`, `task_family=arith`, `status!=failed`, `calls>=3`, `task_id~q-1`: one predicate.

    ValueError naming the problem for an unknown field, a missing operator or a non-numeric bound.
    """
    for op in _OPS:  # two-character operators first (dict order)
        key, sep, value = text.partition(op)
        if sep:
            key, value = key.strip(), value.strip()
            if key not in FIELDS:
                raise ValueError(f"unknown field {key!r} in {text!r}; fields: {', '.join(FIELDS)}")
            if op in (">=", "<=", ">", "<"):
                try:
                    float(value)
                except ValueError:
                    raise ValueError(f"{op} needs a number, got {value!r} in {text!r}") from None
            check = _OPS[op]
            return lambda ep: check(_field(ep, key), value)
    raise ValueError(f"expected FIELD OP VALUE (ops: {' '.join(_OPS)}), got {text!r}")


def select_episodes(run_dir: Path, filters: list[str] | None = None, unreadable: list[int] | None = None) -> list[dict]:
    """The recorded episodes that pass every filter, in the order they finished (`unreadable`: as
    `iter_episodes`)."""
    checks = [parse_filter(f) for f in filters or ()]
    return [ep for ep in iter_episodes(run_dir, unreadable) if all(check(ep) for check in checks)]


def find_episode(
    run_dir: Path, episode_id: str | None, filters: list[str] | None = None, unreadable: list[int] | None = None
) -> dict:
    """That episode, or the last one that passes the filters; NoEpisode, saying how many lines of the
    log could not be read, when there is none."""
    last = None
    checks = [parse_filter(f) for f in filters or ()]
    skipped = [] if unreadable is None else unreadable
    for ep in iter_episodes(run_dir, skipped):
        if (episode_id is None or ep.get("episode_id") == episode_id) and all(c(ep) for c in checks):
            last = ep
            if episode_id is not None:
                return ep
    if last is None:
        what = f"episode {episode_id!r}" if episode_id else "no episode" + (" matches the filters" if checks else "")
        said = f"{what} not found in {run_dir}" if episode_id else f"{what} in {run_dir}"
        raise NoEpisode(said + (f"; {unreadable_note(run_dir, skipped)}" if skipped else ""))
    return last


def render_list(episodes: list[dict], limit: int, console: Console | None = None) -> None:
    """One row per episode (the last `limit`): id, task, family, reward, status, calls, policy version."""
    console = console or Console()
    table = Table(title=f"{len(episodes)} episode(s)" + (f", the last {limit} shown" if len(episodes) > limit else ""))
    for column in ("episode_id", "task_id", "task_family", "reward", "status", "calls", "policy_version"):
        table.add_column(column, justify="right" if column in ("reward", "calls", "policy_version") else "left")
    for ep in episodes[-limit:]:
        reward = ep.get("reward")
        table.add_row(
            str(ep.get("episode_id")),
            str(ep.get("task_id")),
            str(ep.get("task_family")),
            "-" if reward is None else f"{reward:.3f}",
            str(ep.get("status") or "finished"),
            str(len(ep.get("calls", ()))),
            str(ep.get("policy_version")),
        )
    console.print(table)


def episode_calls(ep: dict) -> list[Call]:
    return [
        Call(c.get("agent", "main"), c["prompt_ids"], c["completion_ids"], c["logprobs"], c.get("policy_version", 0))
        for c in ep["calls"]
    ]


def episode_segments(ep: dict) -> list[Segment]:
    """The episode's samples as training built them: one per choice in a group-call episode.

    A group-call episode trains each choice as its own sample (never merged), so
    inspecting it must not merge them either, or the rewards would not line up.
    """
    calls = episode_calls(ep)
    if ep.get("choice_rewards") is not None:
        segs = [merge([c], enabled=False)[0] for c in calls]
        for i, seg in enumerate(segs):
            seg.calls = [i]  # the index in the episode, not in the one-call merge
        return segs
    return merge(calls)


def segment_rewards(ep: dict, segs: list[Segment]) -> list[float | None]:
    """The reward each sample trained with (the same rules as `swarm.timeline.episode_samples`).

    A choice's own reward in a group-call episode, an agent's in a team episode,
    else the episode's; None where nothing was recorded (a failed episode).
    """
    choices = ep.get("choice_rewards")
    if choices is not None and len(choices) == len(segs):
        return [float(r) for r in choices]
    agents = ep.get("agent_rewards") or {}
    reward = ep.get("reward")
    return [float(agents[s.agent]) if s.agent in agents else (None if reward is None else float(reward)) for s in segs]


def _verdict(reward: float | None, rewards: list[float | None]) -> str:
    """'wrong' (no reward), 'partial' (below the episode's best sample) or 'best', for marking samples."""
    known = [r for r in rewards if r is not None]
    if reward is None or not known:
        return ""
    if reward <= 0:
        return "wrong"
    return "partial" if reward < max(known) else "best"


def _fmt(reward: object) -> str:
    return f"{reward:.3f}" if isinstance(reward, (int, float)) else str(reward)


def _piece(decode: Callable[[list[int]], str], tid: int) -> str:
    return decode([tid])


def render_terminal(ep: dict, decode: Callable[[list[int]], str], console: Console | None = None) -> None:
    console = console or Console()
    calls = episode_calls(ep)
    segs = episode_segments(ep)
    rewards = segment_rewards(ep, segs)
    st = merge_stats(calls, segs)
    console.print(
        f"[bold]episode[/] {ep.get('episode_id')}  task {ep.get('task_id')}  "
        f"reward {_fmt(ep.get('reward'))}  calls {st.calls} → samples {st.samples} "
        f"(merge ratio {st.merge_ratio:.2f}, tokens {st.tokens_unmerged} → {st.tokens_merged})"
    )
    for k, (seg, reward) in enumerate(zip(segs, rewards)):
        verdict = _verdict(reward, rewards)
        color = {"wrong": "red", "partial": "yellow", "best": "green"}.get(verdict, "default")
        console.rule(
            f"sample {k}: agent {seg.agent}, [{color}]reward {_fmt(reward)}[/]"
            f"{' (' + verdict + ')' if verdict == 'wrong' else ''}, {len(seg.input_ids)} tokens, "
            f"{sum(seg.loss_mask)} trained, calls {seg.calls}"
        )
        text = Text()
        for tid, m, lp in zip(seg.input_ids, seg.loss_mask, seg.logprobs):
            piece = _piece(decode, tid)
            text.append(piece, style=_style(m, lp))
        console.print(text)
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("pos", "id", "text", "mask", "logprob"):
            table.add_column(col, justify="right" if col != "text" else "left")
        for pos, (tid, m, lp) in enumerate(zip(seg.input_ids, seg.loss_mask, seg.logprobs)):
            if m:
                table.add_row(str(pos), str(tid), repr(_piece(decode, tid)), "1", f"{lp:.3f}")
        console.print(table)


def _style(mask: int, lp: float) -> str:
    if not mask:
        return "grey50"
    return "bold green" if lp > -0.5 else ("green" if lp > -2 else "yellow")


def render_html(ep: dict, decode: Callable[[list[int]], str]) -> str:
    calls = episode_calls(ep)
    segs = episode_segments(ep)
    rewards = segment_rewards(ep, segs)
    st = merge_stats(calls, segs)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>episode "
        f"{html.escape(str(ep.get('episode_id')))}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em}"
        ".t{font-family:ui-monospace,monospace;white-space:pre-wrap;border-radius:3px}"
        ".m0{color:#888}.m1{background:#d7f5d7}.low{background:#fbecc0}"
        "span.t:hover{outline:1px solid #333}"
        ".wrong{color:#b00020}.partial{color:#a06000}.best{color:#1b7a1b}</style></head><body>",
        f"<h1>Episode {html.escape(str(ep.get('episode_id')))}</h1>",
        f"<p>task {html.escape(str(ep.get('task_id')))} &middot; reward {html.escape(_fmt(ep.get('reward')))} &middot; "
        f"calls {st.calls} &rarr; samples {st.samples} (merge ratio {st.merge_ratio:.2f}) &middot; "
        f"tokens {st.tokens_unmerged} &rarr; {st.tokens_merged}</p>",
        "<p>Hover a token for its id, loss mask, rollout logprob and agent. Green: trained "
        "(generated) tokens; grey: context.</p>",
    ]
    for k, (seg, reward) in enumerate(zip(segs, rewards)):
        verdict = _verdict(reward, rewards)
        badge = (
            f"<span class='{verdict}'>reward {html.escape(_fmt(reward))}</span>"
            if verdict
            else f"reward {html.escape(_fmt(reward))}"
        )
        parts.append(
            f"<h2>Sample {k} &middot; agent {html.escape(seg.agent)} &middot; {badge} &middot; "
            f"{len(seg.input_ids)} tokens, {sum(seg.loss_mask)} trained</h2><div>"
        )
        for pos, (tid, m, lp) in enumerate(zip(seg.input_ids, seg.loss_mask, seg.logprobs)):
            cls = "m0" if not m else ("m1" if lp > -2 else "m1 low")
            title = f"pos {pos} | id {tid} | mask {m} | logprob {lp:.4f} | agent {seg.agent}"
            parts.append(
                f"<span class='t {cls}' title='{html.escape(title)}'>{html.escape(_piece(decode, tid))}</span>"
            )
        parts.append("</div>")
    parts.append("</body></html>")
    return "".join(parts)


#: what a folder holds to decode with: one of these (a Hugging Face tokenizer's files)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_problem(path: Path) -> str | None:
    """Why `path` has no tokenizer to decode with, or None. Said before transformers is asked, whose
    answer for a folder that is not there is about Hugging Face repo ids."""
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir() or not any((path / name).is_file() for name in TOKENIZER_FILES):
        return f"{path} holds no tokenizer (no {' or '.join(TOKENIZER_FILES[:2])})"
    return None


def _tokenizer_dir(model: Path | None, ep: dict) -> Path:
    """The folder to decode `ep` with: --model (checked before the log was read), else the model its run
    recorded, else the embedded one; a one-line refusal naming --model when that has no tokenizer."""
    if model is not None:
        return model
    recorded = ep.get("model_dir")
    found = Path(recorded) if recorded else default_model_dir()
    if (problem := tokenizer_problem(found)) is not None:
        whose = "the run's model" if recorded else "the embedded model (the run recorded none)"
        raise typer.BadParameter(
            f"{whose}: {problem}; give --model DIR, a folder with its tokenizer", param_hint="--model"
        )
    return found


def inspect_command(
    run_dir: Path = typer.Argument(
        ..., help="a `swarm train --out` or `swarm serve --out` folder, or its rollouts.jsonl itself"
    ),
    episode: str = typer.Option(
        None, "--episode", "-e", help="episode id", show_default="the last recorded (that passes the filters)"
    ),
    list_: bool = typer.Option(False, "--list", "-l", help="list the episodes (that pass the filters) instead"),
    filters: list[str] = typer.Option(
        None,
        "--filter",
        "-f",
        help="FIELD OP VALUE, repeatable (all must hold): "
        "fields episode_id task_id task_family group_id reward status policy_version "
        "calls; ops = != > >= < <= ~ (contains); e.g. 'reward>0' task_family=arith",
    ),
    limit: int = typer.Option(50, "--limit", min=1, help="rows of --list (the most recent)"),
    model: Path = typer.Option(
        None, "--model", help="tokenizer dir", show_default="the run's model, else the embedded one"
    ),
    html_out: Path = typer.Option(None, "--html", help="also write a standalone HTML page here"),
) -> None:
    """Show a recorded episode token by token (text, id, loss mask, logprob, agent), or list episodes."""
    require_output(html_out, "--html")  # the paths given are checked before the log is read
    if model is not None and (problem := tokenizer_problem(model)) is not None:
        raise typer.BadParameter(problem, param_hint="--model")
    unreadable: list[int] = []
    try:
        if list_:
            render_list(select_episodes(run_dir, filters, unreadable), limit)
        else:
            ep = find_episode(run_dir, episode, filters, unreadable)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--filter") from None
    except FileNotFoundError as exc:  # the folder: no log in it, or one per policy
        raise typer.BadParameter(str(exc), param_hint="RUN_DIR") from None
    except KeyError as exc:  # no episode of that id (or none matching the filters)
        hint = "--episode" if episode else "--filter" if filters else "RUN_DIR"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    if unreadable:
        typer.echo(f"swarm inspect: {unreadable_note(run_dir, unreadable)}", err=True)
    if list_:
        return
    tok_dir = _tokenizer_dir(model, ep)
    require_extra("server", "transformers")
    from swarm.chat.tokenizers import load_tokenizer  # lazy: transformers takes seconds to import

    tok = load_tokenizer(tok_dir)
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    render_terminal(ep, decode)
    if html_out:
        write_output(html_out, render_html(ep, decode))
        typer.echo(f"wrote {html_out}")
