"""The `calc` side of `bench/vs_trl.py --task calc`: multi-turn tool use, Roost against TRL's `GRPOTrainer(tools=)`.

`calc` (swarm/tasks/calc.py) asks "What is 47*85?" with a `multiply(a, b)` tool: the model calls the
tool, reads its result and answers; 1.0 for the right answer, 0.5 for a call that returned the product
and a wrong answer. Roost runs calc's own workflow (the plain OpenAI client, up to 3 calls of at most 40
new tokens each) as one episode per sample; TRL runs its in-process tool loop: one `model.generate` per
turn over every sample still calling a tool, the tool's result appended as a masked tool turn.

What is matched, and how (each checked by tests/unit/test_vs_trl_calc.py):

* the prompt, token for token: TRL gets the tool as calc's own JSON spec (`calc.TOOLS[0]`) that is also
  callable (`MultiplyTool`), so the chat template renders the spec the model was warm-started on; a
  plain Python function would be rendered from its docstring and type hints (different text);
* the tool: `calc.run_tool` with the call's arguments; the reward: `calc.reward`, with the workflow's
  `right_call` (a tool result equal to the product) read back from TRL's conversation;
* turns and tokens: at most 40 new tokens a turn (`generation_kwargs`), 3 turns
  (`max_tool_calling_iterations` = 2 tool rounds), and a total budget that never binds;
* the call syntax: the embedded template's Hermes calls, parsed on TRL's side by a
  `response_template` (TRL has none for this template) that agrees with Roost's `hermes` parser.
"""

from __future__ import annotations

from pathlib import Path

from swarm.tasks import calc

#: From the start (~0.2, mostly half credit for a right call) to just above where 300 s of either side ends (~0.32).
LEVELS = (0.22, 0.25, 0.28, 0.3, 0.32, 0.34)
MATCHED = {
    "prompts_per_step": 8,
    "group_size": 8,
    "lr": 1e-4,
    "temperature": 1.0,
    "max_tokens": calc.MAX_TOKENS,  # a turn's (a call's) new tokens
    "max_turns": calc.MAX_TURNS,
    "clip_eps": 0.2,
    "kl_coef": 0.0,
    "adam_betas": "(0.9, 0.99)",
    "loss_agg": "token-mean over the model's tokens, tool turns masked (TRL: dapo, tool_mask)",
    "advantage": "grpo, group std (TRL: scale_rewards=group)",
    "updates_per_batch": 1,
    "reward": "calc.reward, 0.5 for a call that returned the product",
}
#: Tokens a tool turn may take inside TRL's completion (`<|im_end|>`, the user turn with the
#: `<tool_response>` block, the next assistant header): a product is ~20, an error message ~30.
TOOL_TURN_BUDGET = 48
#: TRL's `max_completion_length` covers the whole multi-turn completion (model and tool tokens);
#: Roost has no such total, only 40 tokens a call: set so that it never binds.
MAX_COMPLETION = calc.MAX_TURNS * calc.MAX_TOKENS + (calc.MAX_TURNS - 1) * TOOL_TURN_BUDGET
DIFFERENT = [
    "generation: Roost runs calc's workflow as an episode per sample (an OpenAI-client call per turn over HTTP to "
    "the server's continuous-batching torch engine; a group cannot be one call, each turn depends on the last "
    "one's tool result); TRL calls model.generate on the whole batch for the first turn, then once per tool round "
    "on the samples still calling a tool",
    "call parsing: Roost's server parses calls with its `hermes` parser, TRL with transformers' parse_response "
    "and a response_template for the embedded template's Hermes calls (the same calls on well-formed and "
    "malformed text); TRL also casts call arguments to the tool's schema types ('47' -> 47), which Roost's "
    "run_tool refuses as not an integer",
    "a turn's token budget: both 40 new tokens a turn; TRL also caps the whole completion (model and tool tokens) "
    f"at {MAX_COMPLETION}, set so that it never binds",
    "gradient clipping: both 1.0; Roost clips the whole step, TRL per optimiser step (the same here)",
    "Roost streams episodes from a client process and trains a step as soon as 8 groups are complete, and the "
    "next step's episodes are claimed while it trains (their calls wait for the new weights: still on-policy); "
    "TRL generates then trains in one loop",
    "Roost's training forward computes each group's shared prompt once (the same gradient up to float rounding); "
    "TRL's computes every completion's prompt",
    "TRL's bf16 and gradient checkpointing (on by default in GRPOConfig) are turned off: fp32, no recomputation, "
    "its fastest settings on a CPU",
]

#: TRL's Qwen3 response template without its `<think>` field: the embedded template writes calls as
#: Qwen2.5's Hermes `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>` after the assistant
#: header (swarm/model/tokenizer.py).
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


class MultiplyTool(dict):
    """calc's `multiply` for TRL: the dict is calc's tool spec (what transformers renders into the
    prompt, unchanged), the call is calc's `run_tool` (what Roost's workflow executes)."""

    __name__ = calc.TOOL_NAME

    def __init__(self) -> None:
        super().__init__(calc.TOOLS[0])

    def __call__(self, **arguments: object) -> str:
        return calc.run_tool(calc.TOOL_NAME, arguments)


def episode_reward(messages: list[dict], answer: str) -> float:
    """calc.workflow's reward for a conversation as TRL's reward function sees it (the assistant and
    tool messages after the prompt): the final answer's `calc.reward` with `right_call` set when a
    tool result was the product; a conversation that ends on a call (its turns used up) runs those
    calls too and scores as the workflow does after its last turn."""
    right_call = any(m["role"] == "tool" and m.get("content") == answer for m in messages)
    last = messages[-1] if messages else {"role": "assistant", "content": ""}
    if last["role"] == "assistant" and not last.get("tool_calls"):
        return calc.reward(last.get("content") or "", answer, right_call)
    if last["role"] == "assistant":
        results = [calc.run_tool(c["function"]["name"], c["function"]["arguments"]) for c in last["tool_calls"]]
        right_call = right_call or answer in results
    return calc.RIGHT_CALL_REWARD if right_call else 0.0


def reward(completions: list[list[dict]], answer: list[str], **_: object) -> list[float]:
    return [episode_reward(c, a) for c, a in zip(completions, answer)]


def dataset_rows(seed: int = 0, size: int = 20_000) -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
        for r in calc.dataset(seed, size)
    ]


def config_kwargs() -> dict:
    """GRPOConfig settings that calc adds to (or changes from) the matched ones `vs_trl.trl_settings` sets."""
    return {
        "max_completion_length": MAX_COMPLETION,
        "generation_kwargs": {"max_new_tokens": calc.MAX_TOKENS},
        "max_tool_calling_iterations": calc.MAX_TURNS - 1,
        "adam_beta2": 0.99,  # Roost's AdamW betas (0.9, 0.99); arith's bench leaves TRL's default 0.999
    }


def prepare_tokenizer(tokenizer):  # noqa: ANN001, ANN201 - a transformers tokenizer
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def roost_args() -> list[str]:
    """`swarm train` flags for calc: an episode per sample (calc's workflow makes several calls)."""
    return ["--no-group-call", "--concurrency", str(MATCHED["prompts_per_step"] * MATCHED["group_size"])]


def held_out(model: Path, n: int = 200, seed: int = 424242) -> dict | None:
    """calc's workflow on `n` problems of a seed neither side trains on, temperature 1 (sampled): the
    mean reward (partial credit included) and the accuracy (the exact product as the answer)."""
    import torch  # lazy: only after both runs ended
    from transformers import AutoTokenizer

    from swarm.model.adapter import load_causal_lm, tokenizer_dir
    from swarm.model.evaluate import LocalOpenAI, run_workflows

    if not (model / "config.json").exists():
        return None
    lm = load_causal_lm(model)
    lm.eval()
    client = LocalOpenAI(lm, AutoTokenizer.from_pretrained(tokenizer_dir(model)), temperature=1.0)
    torch.manual_seed(seed)
    rewards = run_workflows(client, calc.workflow, calc.dataset(seed, n))
    return {
        "mean_reward": round(sum(rewards) / n, 4),
        "accuracy": round(sum(r == 1.0 for r in rewards) / n, 4),
        "calls_per_episode": round(client.calls / n, 2),
    }
