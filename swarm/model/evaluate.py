"""Score a model directory on the built-in tasks, in process, with no server.

    python -m swarm.model.evaluate DIR --task arith --n 200

The tasks' own workflows run unchanged against `LocalOpenAI`, a stand-in for
`openai.OpenAI` whose `chat.completions.create` renders the chat template and
calls Hugging Face `generate`. Sampling at temperature 1 is pure sampling (no
top-k/top-p), which is what RL rollouts use; temperature 0 is greedy. Used to
calibrate the warm start and as a quick sanity check of any checkpoint.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from openai.types.chat import ChatCompletion


class LocalOpenAI:
    """Just enough of `openai.OpenAI` for the built-in workflows: `chat.completions.create`."""

    def __init__(self, model, tokenizer, default_temperature: float | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.temperature_override = default_temperature
        self.calls = 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, *, model: str, messages: list[dict], max_tokens: int = 64,
                temperature: float = 1.0, **_: object) -> ChatCompletion:
        if self.temperature_override is not None:
            temperature = self.temperature_override
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = torch.tensor([tok.encode(text, add_special_tokens=False)])
        sample = temperature > 0
        extra = {"temperature": temperature, "top_k": 0, "top_p": 1.0} if sample else {}
        with torch.no_grad():
            out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                      max_new_tokens=max_tokens, do_sample=sample, **extra)
        new = out[0, prompt.shape[1]:].tolist()
        eos = tok.convert_tokens_to_ids(tok.eos_token)
        finish = "stop" if eos in new else "length"
        if eos in new:
            new = new[:new.index(eos)]
        self.calls += 1
        return ChatCompletion.model_validate({
            "id": f"local-{self.calls}", "object": "chat.completion", "created": 0,
            "model": model,
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant",
                                     "content": tok.decode(new, skip_special_tokens=True)}}],
        })


def evaluate(model_dir: Path, task_name: str, n: int = 200, temperature: float = 1.0,
             seed: int = 12345, model=None, tokenizer=None) -> dict:
    """Mean reward of `task_name`'s workflow over `n` dataset items (dataset seed `seed`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarm.tasks import get_task

    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model.eval()
    task = get_task(task_name)
    client = LocalOpenAI(model, tokenizer, default_temperature=temperature)
    episode = SimpleNamespace(openai=client, model="local")
    torch.manual_seed(seed)
    started = time.monotonic()
    rewards = [task.workflow(item, episode) for item in task.dataset(seed, n)]
    return {"task": task_name, "temperature": temperature, "n": n,
            "mean_reward": sum(rewards) / n,
            "solved": sum(r > 0 for r in rewards) / n,
            "calls_per_episode": client.calls / n,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--task", action="append", help="task name (repeatable); default all")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--temperature", type=float, action="append")
    args = parser.parse_args()
    from swarm.tasks import list_tasks

    torch.set_num_threads(2)
    for name in args.task or list_tasks():
        for t in args.temperature or [0.0, 1.0]:
            print(evaluate(args.model_dir, name, args.n, t))


if __name__ == "__main__":
    main()
