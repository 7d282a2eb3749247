"""smolagents' ToolCallingAgent (OpenAI server model): `add`, then its `final_answer` tool.

smolagents forces a tool call every step (`tool_choice: "required"`), so both turns are forced
calls: prefilled and constrained. Its history does not echo the model's turn: it sends a call back
as assistant text of its own (`Calling tools:\n[{'id': ..., 'function': {...}}]`) and the result
as a user `Observation:`, so the next prompt does not continue the ids the model generated and the
two calls are two samples (each trained on exactly its own completion), not one.
"""

from __future__ import annotations

from suite import ANSWER, QUESTION, Roost, need

smolagents = need("smolagents")


def test_tool_calling_agent(roost: Roost) -> None:
    @smolagents.tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        return a + b

    with roost.client().episode("fw-smolagents") as ep:
        model = smolagents.OpenAIServerModel(model_id=ep.model, api_base=ep.base_url, api_key=ep.api_key)
        agent = smolagents.ToolCallingAgent(tools=[add], model=model, max_steps=3, verbosity_level=0)
        assert agent.run(QUESTION) == ANSWER
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=2, samples=2)
