"""The glue between tinker-cookbook (0.5.8, unchanged) and a Roost server's Tinker API.

Everything that trains is the cookbook's: `tinker_cookbook.supervised.train.main` and
`tinker_cookbook.rl.train.main` with their `Config`s, its `FromConversationFileBuilder`, its
`qwen3_instruct` renderer, its `ProblemEnv`/`ProblemGroupBuilder`. What is here:

* `write_chat_jsonl`: a small generated chat data set (the cookbook's conversations.jsonl format);
* `ArithEnv`, `ArithDatasetBuilder`: Roost's `arith` task (swarm/tasks/arith.py: "What is 47+8?" ->
  "55", reward 1 when the reply, stripped, is the answer) as a cookbook RL environment. The problems
  are Roost's own, `swarm.tasks.arith.dataset(seed, n)`, written to JSONL by the full install
  (this venv has no roost);
* `sft_config`, `rl_config`: the configs, with the local model directory as `model_name`.

The model directory is the tokenizer's path (`get_tokenizer` loads a local directory with
`AutoTokenizer.from_pretrained`, nothing from the hub) and the base model's name (the server accepts
its model directory's path as well as its served name). Its tokenizer renders ChatML, so the
renderer is `qwen3_instruct` (`<|im_start|>role\\n...<|im_end|>`, no `<think>`): it renders exactly
the model's own chat template.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import chz
from tinker_cookbook import renderers
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer

RENDERER = "qwen3_instruct"

NAMES = ["Ada", "Bob", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jo", "Kai", "Lea"]
THINGS = {"sky": "blue", "grass": "green", "snow": "white", "sun": "yellow", "coal": "black", "rose": "red"}
WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle", "rocket", "garden"]


def chat_examples(n: int, seed: int = 0) -> list[dict]:
    """`n` short conversations in three fixed patterns: learnable, so a falling loss is learning."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            name = rng.choice(NAMES)
            user, answer = f"Say hello to {name}.", f"Hello, {name}! Nice to meet you."
        elif kind == 1:
            thing = rng.choice(sorted(THINGS))
            user, answer = f"What color is the {thing}?", f"The {thing} is {THINGS[thing]}."
        else:
            word = rng.choice(WORDS)
            user, answer = f"Repeat the word {word} twice.", f"{word} {word}"
        out.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
    return out


def write_chat_jsonl(path: Path, n: int, seed: int = 0) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in chat_examples(n, seed)))
    return path


def sft_config(
    model_dir: str, data: Path, log_path: Path, base_url: str, batch_size: int = 8, lr: float = 2e-3
) -> sl_train.Config:
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model_dir,
        renderer_name=RENDERER,
        max_length=256,
        batch_size=batch_size,
        train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    )
    return sl_train.Config(
        log_path=str(log_path),
        model_name=model_dir,
        recipe_name="roost_sft",
        renderer_name=RENDERER,
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=str(data)),
        learning_rate=lr,
        lr_schedule="constant",
        num_epochs=1,
        lora_rank=8,
        base_url=base_url,
        save_every=0,
        eval_every=0,
        infrequent_eval_every=0,
    )


# ---------------------------------------------------------------------------------- RL: arith


def arith_reward(completion: str, answer: str) -> float:
    """Roost's `swarm.tasks.arith.reward`: 1.0 when the completion, stripped, is exactly the answer."""
    return 1.0 if completion.strip() == answer else 0.0


class ArithEnv(ProblemEnv):
    """One Roost `arith` problem; the reward is arith's exact match (format_coef 0: no format term)."""

    def __init__(self, renderer: renderers.Renderer, question: str, answer: str) -> None:
        super().__init__(renderer, format_coef=0.0)
        self.question, self.answer = question, answer

    def get_question(self) -> str:
        return self.question

    def check_answer(self, sample_str: str) -> bool:
        return arith_reward(sample_str, self.answer) == 1.0

    def check_format(self, sample_str: str) -> bool:
        return True

    def get_reference_answer(self) -> str:
        return self.answer


class ArithDataset(RLDataset):
    """`batch_size` problems a step, each a group of `group_size` samples (GRPO's groups)."""

    def __init__(
        self, problems: list[dict], renderer: renderers.Renderer, batch_size: int, group_size: int, n_batches: int
    ) -> None:
        self.problems, self.renderer = problems, renderer
        self.batch_size, self.group_size, self.n_batches = batch_size, group_size, n_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        out = []
        for j in range(self.batch_size):
            p = self.problems[(index * self.batch_size + j) % len(self.problems)]
            env = partial(ArithEnv, self.renderer, p["question"], p["answer"])
            out.append(ProblemGroupBuilder(env_thunk=env, num_envs=self.group_size, dataset_name="arith"))
        return out

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class ArithDatasetBuilder(RLDatasetBuilder):
    """Problems from a JSONL file of `swarm.tasks.arith.dataset` rows (question, answer)."""

    problems_path: str
    model_name_for_tokenizer: str
    renderer_name: str = RENDERER
    batch_size: int = 8
    group_size: int = 8
    n_batches: int = 20

    async def __call__(self) -> tuple[ArithDataset, None]:
        problems = [json.loads(line) for line in Path(self.problems_path).read_text().splitlines() if line]
        renderer = renderers.get_renderer(self.renderer_name, tokenizer=get_tokenizer(self.model_name_for_tokenizer))
        return ArithDataset(problems, renderer, self.batch_size, self.group_size, self.n_batches), None


def rl_config(
    model_dir: str,
    problems: Path,
    log_path: Path,
    base_url: str,
    steps: int = 20,
    batch_size: int = 8,
    group_size: int = 8,
    lr: float = 2e-3,
) -> rl_train.Config:
    builder = ArithDatasetBuilder(
        problems_path=str(problems),
        model_name_for_tokenizer=model_dir,
        batch_size=batch_size,
        group_size=group_size,
        n_batches=steps,
    )
    return rl_train.Config(
        learning_rate=lr,
        dataset_builder=builder,
        model_name=model_dir,
        recipe_name="roost_rl_arith",
        renderer_name=RENDERER,
        max_tokens=8,  # arith's MAX_TOKENS
        log_path=str(log_path),
        base_url=base_url,
        lora_rank=8,
        eval_every=0,
        save_every=0,
        num_groups_to_log=0,
        rollout_json_export=False,
    )


def read_metrics(log_path: Path) -> list[dict]:
    """The rows the cookbook's logger wrote to `log_path/metrics.jsonl`, one a step."""
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
