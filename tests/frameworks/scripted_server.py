"""A real Roost server on loopback with a scripted engine behind it, for the framework conformance suite.

    python tests/frameworks/scripted_server.py INFO_JSON      # run by the FULL venv (FastAPI, the tokenizer)

The frameworks' own venv is torch-free and has only the client, so the server runs in its own
process from the full install: the same app and HTTP stack as `swarm serve` (`swarm.testing`'s
`running_server`, uvicorn on 127.0.0.1), with a scripted `FakeEngine` instead of the tiny model,
which is untrained and cannot write the tool calls an agent framework needs. It writes
`{"url", "token", "out"}` to INFO_JSON once it serves and stops when its stdin closes or it gets
SIGTERM (the test session that started it ends it by its PID).

The script plays a tool agent for "What is (12 + 30) * 2?", reading only the prompt, as a model
would: with no tool result yet it calls `add(12, 30)`; after one, `mul(42, 2)` when that tool is
declared, else it answers; after two, it answers "The answer is 84.". A forced call's prefill
(`<tool_call>\\n{"name": "`) is continued. When the turn is constrained to a JSON answer (a
`response_format`, or the core's grammar of calls-or-answer), the answer is drawn by the fake from
that JSON schema (so it validates, as a framework's output type demands) and ends the turn.
Every framework test therefore declares `add` (and optionally `mul`) taking integers `a` and `b`.
DSPy's prompts (`[[ ## field ## ]]`) get its ChatAdapter's fields: ReAct calls `add`, then
`finish`, then the extraction answers.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from swarm.config.server import ServerConfig
from swarm.engine.base import GenerateRequest
from swarm.engine.fake import FakeEngine
from swarm.testing import running_server, tiny_model_dir

ANSWER = "The answer is 84."
OPEN = "<tool_call>\n"
PREFILL_ANY = '<tool_call>\n{"name": "'
ARGS = {"add": {"a": 12, "b": 30}, "mul": {"a": 42, "b": 2}, "final_answer": {"answer": ANSWER}}


def _call(name: str) -> str:
    return f'{OPEN}{{"name": "{name}", "arguments": {json.dumps(ARGS[name])}}}\n</tool_call>'


def _answer_schema(response_format: str | None) -> dict[str, Any] | None:
    """The JSON schema a constrained answer must follow: OpenAI's format, or the grammar's `answer` rule."""
    if response_format is None:
        return None
    fmt = json.loads(response_format)
    if fmt.get("type") == "json_schema":
        return fmt["json_schema"].get("schema", {})
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    if fmt.get("type") == "grammar":
        m = re.search(r"^answer: %json (.*)$", fmt["grammar"], re.M)
        return json.loads(m.group(1)) if m else None
    return None


def _dspy(prompt: str) -> str:
    """DSPy's ChatAdapter fields: ReAct's steps (a tool, then `finish`), then its answer extraction."""
    asked = prompt[prompt.rfind("<|im_start|>user") :]
    if "[[ ## next_tool_name ## ]]" in asked:
        seen = asked.count("[[ ## observation_")
        name, args = ("add", ARGS["add"]) if seen == 0 else ("finish", {})
        return (
            f"[[ ## next_thought ## ]]\nStep {seen}.\n\n[[ ## next_tool_name ## ]]\n{name}\n\n"
            f"[[ ## next_tool_args ## ]]\n{json.dumps(args)}\n\n[[ ## completed ## ]]"
        )
    return f"[[ ## reasoning ## ]]\n12 + 30 = 42.\n\n[[ ## answer ## ]]\n{ANSWER}\n\n[[ ## completed ## ]]"


class ScriptedEngine(FakeEngine):
    """The agent script above; a JSON answer is drawn from its schema by the fake's grammar sampler.

    Its context is long (`max_positions`): a script has no model's limit, and smolagents' system
    prompt alone is 2.6k tokens."""

    max_positions = 32768

    def _plan(self, request: GenerateRequest) -> list[int]:
        prompt = self.tokenizer.decode(request.prompt_ids)
        if "[[ ## " in prompt:
            return self._ids(_dspy(prompt)) + [self.eos_id]
        # one question an episode: every tool result so far is this task's (smolagents sends them as
        # user "Observation:" turns rather than tool messages, and its system prompt has examples of them)
        turns = prompt[prompt.find("<|im_start|>user") :]
        done = max(turns.count("<tool_response>"), turns.count("Observation:"))
        tools = (
            set(re.findall(r'"name": "(\w+)"', prompt[: prompt.find("</tools>")])) if "</tools>" in prompt else set()
        )
        step = "add" if done == 0 else ("mul" if done == 1 and "mul" in tools else None)
        if step is None and "final_answer" in tools:  # smolagents ends by calling its final_answer tool
            step = "final_answer"
        end = self.grammars().end_ids[:1] if request.params.response_format else [self.eos_id]
        if prompt.endswith(PREFILL_ANY):  # a forced call: continue its name
            name = step or "add"
            return self._ids(_call(name)[len(PREFILL_ANY) :]) + end
        if step is not None:
            return self._ids(_call(step)) + end
        schema = _answer_schema(request.params.response_format)
        if schema is not None:
            fmt = json.dumps({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
            matcher = self.grammars().matcher(fmt)
            return self._constrained_plan(matcher, self._rng, request.params.max_tokens)
        return self._ids(ANSWER) + [self.eos_id]

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def main(info: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="roost-frameworks-"))
    model = tiny_model_dir(work)
    config = ServerConfig(
        engine="fake", model_dir=model, out_dir=work / "server", group_size=1, batch_groups=1000, port=0
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with running_server(config, ScriptedEngine(model, seed=0, chunk_tokens=3)) as srv:
        tmp = info.with_suffix(".tmp")  # written whole, then renamed: a reader never sees half of it
        tmp.write_text(json.dumps({"url": srv.url, "token": srv.token, "out": str(srv.swarm.out_dir)}))
        tmp.rename(info)
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        stop.wait()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
