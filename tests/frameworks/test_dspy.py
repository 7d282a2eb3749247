"""DSPy ReAct (through litellm, ChatAdapter): `add`, then `finish`, then the answer extraction.

DSPy writes each call's prompt afresh (the trajectory as fields of a new user message) and parses
fields from text, so its three calls continue nothing of each other: three samples, each trained
on exactly its own completion.
"""

from __future__ import annotations

from suite import ANSWER, QUESTION, Roost, add, need

dspy = need("dspy")


def test_react(roost: Roost) -> None:
    with roost.client().episode("fw-dspy") as ep:
        lm = dspy.LM(f"openai/{ep.model}", api_base=ep.base_url, api_key=ep.api_key, cache=False, num_retries=0)
        react = dspy.ReAct("question -> answer", tools=[add], max_iters=3)
        with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
            got = react(question=QUESTION)
        assert got.answer == ANSWER
        assert got.trajectory["tool_name_0"] == "add" and got.trajectory["observation_0"] == 42
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=3, samples=3)
