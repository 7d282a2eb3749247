"""Score a model directory on the built-in tasks, in process, with no server.

    swarm eval --model DIR --task arith --n 200     # greedy and T=1
    swarm eval --model runs/train --task arith      # a run: its last checkpoint beside the model it started from
    swarm eval --model CHECKPOINT --baseline        # a run's checkpoint, the same comparison

The tasks' own workflows run unchanged, one thread per episode, against
`LocalOpenAI`: a stand-in for `openai.OpenAI` (only `chat.completions.create`)
that renders the chat template and answers all waiting episodes with one
batched Hugging Face `generate` call; with `tools=` it renders them and parses
tool calls with the server's Hermes parser, as `swarm serve` does. Temperature 1 is pure sampling (no
top-k/top-p), what RL rollouts use; temperature 0 is greedy. Used to calibrate
the warm start and as a quick sanity check of any checkpoint.

RL on the embedded model mostly sharpens sampling (temperature 1 rises a lot)
while greedy may dip a little; one number alone hides which, so a run is scored
beside the model it started from (`run_models`, `comparison_table`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from openai.types.chat import ChatCompletion
from rich.table import Table
from transformers import AutoTokenizer

from store.paths import default_model_dir
from swarm.chat.tool_parsers import get_parser, parse
from swarm.model.adapter import load_causal_lm, tokenizer_dir
from swarm.run_layout import run_summary, server_of
from swarm.tasks import get_task

CHECKPOINT_STATE = "server_state.json"  # what marks a server checkpoint (swarm/server/checkpoint.py)


class LocalOpenAI:
    """Just enough of `openai.OpenAI` for the built-in workflows, batched across threads.

    `create` blocks its caller; `serve(n_episodes)` (run by the owner thread)
    waits until every live episode is blocked in `create` or done, answers them
    with one `generate`, and repeats until all `n_episodes` called `episode_done`.
    `temperature`, when set, overrides what the workflow asks for. `named` gives other models by the
    `model` a call names (a team's roles: `{"planner": (model, tokenizer)}`); any other name is `model`'s.
    """

    def __init__(self, model, tokenizer, temperature: float | None = None, named: dict | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.named = dict(named or {})
        self.temperature = None if temperature is None else float(temperature)
        self.calls = 0
        self._episode = threading.local()  # the item the calling thread plays (`bind`)
        self._cv = threading.Condition()
        self._pending: list[dict] = []
        self._live = 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(
        self,
        *,
        model: str,
        messages: list[dict],
        max_tokens: int = 64,
        temperature: float = 1.0,
        tools: list[dict] | None = None,
        **_: object,
    ) -> ChatCompletion:
        request = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "tools": tools,
            "temperature": temperature if self.temperature is None else self.temperature,
            "episode": getattr(self._episode, "index", 0),
            "done": threading.Event(),
        }
        with self._cv:
            self._pending.append(request)
            self._cv.notify_all()
        request["done"].wait()
        if "error" in request:
            raise request["error"]
        return request["response"]

    def bind(self, index: int) -> None:
        """The calling thread plays item `index`: its calls take that place in every batch."""
        self._episode.index = index

    def episode_done(self) -> None:
        with self._cv:
            self._live -= 1
            self._cv.notify_all()

    def serve(self, n_episodes: int) -> None:
        with self._cv:
            self._live = n_episodes
        while True:
            with self._cv:
                self._cv.wait_for(lambda: len(self._pending) >= self._live)
                if self._live == 0:
                    return
                # in item order, not in the order the threads happened to call: a batch's rows draw their
                # samples in row order, so `--seed` repeats only if every batch is the same batch
                batch, self._pending = sorted(self._pending, key=lambda r: r["episode"]), []
            by_model: dict[str, list[dict]] = {}
            for request in batch:  # one `generate` per model the waiting calls name
                by_model.setdefault(request["model"] if request["model"] in self.named else "", []).append(request)
            for name, requests in by_model.items():
                model, tokenizer = self.named.get(name, (self.model, self.tokenizer))
                try:
                    self._answer(requests, model, tokenizer)
                except Exception as exc:  # surface in the episode threads, do not hang them
                    for request in requests:
                        request["error"] = exc
            for request in batch:
                request["done"].set()

    def _answer(self, batch: list[dict], model, tok) -> None:
        eos = tok.convert_tokens_to_ids(tok.eos_token)
        pad = tok.convert_tokens_to_ids(tok.pad_token)
        prompts = [
            tok.encode(
                tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False, tools=r["tools"]),
                add_special_tokens=False,
            )
            for r in batch
        ]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        temperature = float(batch[0]["temperature"])  # one value per evaluation run
        sample = temperature > 0
        extra = {"temperature": temperature, "top_k": 0, "top_p": 1.0} if sample else {}
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                do_sample=sample,
                max_new_tokens=max(r["max_tokens"] for r in batch),
                eos_token_id=eos,
                pad_token_id=pad,
                **extra,
            )
        for request, row in zip(batch, out[:, width:].tolist()):
            row = row[: request["max_tokens"]]
            finish = "stop" if eos in row else "length"
            if eos in row:
                row = row[: row.index(eos)]
            self.calls += 1
            message: dict = {"role": "assistant", "content": tok.decode(row, skip_special_tokens=True)}
            if request["tools"]:  # the server's own parser: the same calls it would return
                got = parse(get_parser("hermes"), message["content"])
                if got.calls:
                    finish = "tool_calls"
                    message = {
                        "role": "assistant",
                        "content": got.content or None,
                        "tool_calls": [
                            {
                                "id": f"call_{self.calls}_{k}",
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments},
                            }
                            for k, c in enumerate(got.calls)
                        ],
                    }
            request["response"] = ChatCompletion.model_validate(
                {
                    "id": f"local-{self.calls}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": request["model"],
                    "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                }
            )


def run_workflows(client: LocalOpenAI, workflow, items: list[dict], episode: Callable[[], Any] | None = None) -> list:
    """Run `workflow(item, episode())` for every item concurrently against `client`; what each returned.

    `episode` makes what a workflow plays (default: one model, `.openai` and `.model`); a reward is a
    float, a team's a `{role: reward}`."""
    rewards: list = [0.0] * len(items)
    errors: list[BaseException] = []
    make = episode or (lambda: SimpleNamespace(openai=client, model="local"))

    def play(i: int) -> None:
        client.bind(i)
        try:
            got = workflow(items[i], make())
            rewards[i] = got if isinstance(got, dict) else float(got)
        except BaseException as exc:  # re-raised once below, not printed by every thread
            errors.append(exc)
        finally:
            client.episode_done()

    threads = [threading.Thread(target=play, args=(i,), daemon=True) for i in range(len(items))]
    for t in threads:
        t.start()
    client.serve(len(items))
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return rewards


def evaluate(
    model_dir: Path,
    task_name: str,
    n: int = 200,
    temperature: float = 1.0,
    seed: int = 12345,
    loaded: Loaded | None = None,
) -> dict:
    """Mean reward of `task_name`'s workflow over `n` items of `dataset(seed, n)` (`loaded` keeps the model
    for the next call)."""
    model, tokenizer = (Loaded() if loaded is None else loaded)[Path(model_dir)]
    task = get_task(task_name)
    client = LocalOpenAI(model, tokenizer, temperature=temperature)
    torch.manual_seed(seed)
    started = time.monotonic()
    rewards = run_workflows(client, task.workflow, task.dataset(seed, n))
    return score_row(task_name, temperature, rewards, client.calls, time.monotonic() - started)


def score_row(task: str, temperature: float, rewards: list[float], calls: int, seconds: float) -> dict:
    """One row of `swarm eval`'s results: the mean reward of the episodes, the share with any reward, the
    calls per episode."""
    n = len(rewards)
    return {
        "task": task,
        "temperature": temperature,
        "n": n,
        "mean_reward": round(sum(rewards) / n, 4),
        "solved": round(sum(r > 0 for r in rewards) / n, 4),
        "calls_per_episode": round(calls / n, 2),
        "seconds": round(seconds, 1),
    }


class Loaded(dict):
    """Models and tokenizers by path, each loaded once: `swarm eval` scores one model on every task and
    temperature (and a team's base for several roles), and a 0.5B model takes seconds to load."""

    def __missing__(self, path: Path) -> tuple:
        model = load_causal_lm(path)  # a LoRA checkpoint: merged into its base
        model.eval()
        self[path] = (model, AutoTokenizer.from_pretrained(tokenizer_dir(path)))
        return self[path]


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """`checkpoints/latest` resolved, else the highest complete `step_*` (the server's own rule)."""
    latest = checkpoints / "latest"
    if (latest / CHECKPOINT_STATE).is_file():
        return latest.resolve()
    done = sorted(p for p in checkpoints.glob("step_*") if (p / CHECKPOINT_STATE).is_file())
    return done[-1] if done else None


def initial_model(server_dir: Path) -> Path | None:
    """The model a server started from, as its `config.yaml` records it (the embedded one by default)."""
    config = server_dir / "config.yaml"
    if not config.is_file():
        return None
    try:
        settings = yaml.safe_load(config.read_text()) or {}
    except yaml.YAMLError:
        return None
    return Path(settings.get("model_dir") or default_model_dir())


def run_models(path: Path) -> tuple[Path, Path | None]:
    """(the model to evaluate, the model its run started from or None) for a path given to `swarm eval`.

    A `swarm train` run folder (OUT, holding `server/`) or a server's `--out` folder
    means its last checkpoint, compared with the initial model named in the server's
    `config.yaml`; a checkpoint directory of a run is evaluated itself, with that same
    initial model; any other directory is a plain model with nothing to compare with.
    """
    path = Path(path)
    for server_dir in (path / "server", path):
        policies = server_dir / "policies"
        if policies.is_dir() and (server_dir / "config.yaml").is_file():  # a server of several policies
            names = sorted(p.name for p in policies.iterdir() if p.is_dir())
            ready = [n for n in names if (policies / n / "checkpoints").is_dir()]
            listed = ", ".join(n if n in ready else f"{n} (no checkpoint yet)" for n in names) or "none yet"
            raise RunFolderError(
                f"{path} trained several policies ({listed}): name one of their folders instead, "
                f"e.g. {policies / (ready or names or ['NAME'])[0]}"
            )
        if (server_dir / "checkpoints").is_dir() and (server_dir / "config.yaml").is_file():  # one model
            checkpoint = latest_checkpoint(server_dir / "checkpoints")
            if checkpoint is not None:
                return checkpoint, initial_model(server_dir)
    servers = sorted(p.name for p in (path / "servers").glob("*") if (p / "config.yaml").is_file())
    if servers and not (path / "config.json").is_file():  # a --team run: a server per model
        raise RunFolderError(
            f"{path} trained a team, a server per model ({', '.join(servers)}): name one of their folders "
            f"instead, e.g. {path / 'servers' / servers[0]}"
        )
    if (path / "checkpoints").is_dir() and path.parent.name == "policies":  # OUT/server/policies/NAME
        checkpoint = latest_checkpoint(path / "checkpoints")
        if checkpoint is not None:
            return checkpoint, initial_model(server_of(path))
    if (path / CHECKPOINT_STATE).is_file():  # OUT/server/checkpoints/step_N (or latest), or a policy's
        return path, initial_model(server_of(path.parent.parent))
    if not (path / "config.json").is_file() and any((d / "config.yaml").is_file() for d in (path / "server", path)):
        status = _summary_status(path)
        raise RunFolderError(
            f"{path} is a run folder with no checkpoint yet{f' (its run {status})' if status else ''}: "
            "a run saves one every --checkpoint-every steps and when it ends after a step"
        )
    return path, None


def _summary_status(path: Path) -> str | None:
    """`ended failed before its first step` from a run folder's summary.json, if it says so."""
    summary = run_summary(path)
    if summary is None or "status" not in summary:
        return None
    steps = summary.get("steps_done")
    return f"ended {summary['status']}" + (" before its first step" if steps == 0 else "")


class RunFolderError(ValueError):
    """A run folder that names no one model to evaluate (the message says which to give)."""


def comparison_table(results: list[dict]) -> Table:
    """Mean reward per model (rows) and temperature (columns), a task per block, with the change.

    `results` are `evaluate` rows carrying `model_role` ("initial" or "trained"; a team's other mixes, such
    as "only planner trained", go between them). Greedy and sampled side by side, because training may
    raise one and lower the other.
    """
    temps = sorted({r["temperature"] for r in results})
    episodes = sorted({r["n"] for r in results})
    table = Table(
        title=f"mean reward, the run's initial model and the trained one ({'/'.join(map(str, episodes))} episodes each)"
    )
    for column in ("model", "task"):
        table.add_column(column)
    for t in temps:
        table.add_column("greedy" if t == 0 else f"sampled (T={t:g})", justify="right")
    for task in dict.fromkeys(r["task"] for r in results):
        reward = {(r["model_role"], r["temperature"]): r["mean_reward"] for r in results if r["task"] == task}
        labels = dict.fromkeys(r["model_role"] for r in results if r["task"] == task)
        middle = [label for label in labels if label not in ("initial", "trained")]
        for role in ("initial", *middle, "trained"):
            table.add_row(role, task, *(f"{reward[role, t]:.3f}" if (role, t) in reward else "-" for t in temps))
        table.add_row(
            "change",
            task,
            *(
                f"{reward['trained', t] - reward['initial', t]:+.3f}"
                if ("trained", t) in reward and ("initial", t) in reward
                else "-"
                for t in temps
            ),
            end_section=True,
        )
    return table
