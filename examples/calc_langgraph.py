"""The calc tool agent as a LangGraph ReAct agent: `create_react_agent` + `ChatOpenAI` + `@tool`.

    swarm client --token secret --workflow examples.calc_langgraph:workflow --n 8 -c 8   # until Ctrl-C
    # (--epochs 1: one pass over the dataset and it exits)
    swarm train --workflow examples.calc_langgraph:workflow --dataset examples.calc_openai:dataset

Nothing here knows about RL: the agent is built per episode with a `ChatOpenAI`
pointed at the episode's `base_url`/`api_key`, LangGraph runs the usual loop (model ->
tool calls -> `ToolNode` -> model ...), and the reward is read from the final message.
The swarm server sees ordinary OpenAI chat calls with `tools=`; it records them as token
ids and merges the turns into one training sample. LangChain derives the tool's spec
from `multiply`'s signature and docstring: exactly the spec of the built-in `calc` task,
so the embedded model sees the prompts it was warm-started on.
"""

from __future__ import annotations

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from examples.calc_openai import dataset

#: model -> tools -> model -> answer takes 4 graph steps; one more round for a retry
RECURSION_LIMIT = 6

__all__ = ["dataset", "multiply", "workflow"]


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def workflow(task: dict, episode) -> float:
    llm = ChatOpenAI(
        base_url=episode.base_url,
        api_key=episode.api_key,
        model=episode.model,
        temperature=1.0,
        max_tokens=40,
        max_retries=0,
    )
    agent = create_react_agent(llm, [multiply])
    try:
        state = agent.invoke(
            {"messages": [{"role": "user", "content": task["question"]}]}, {"recursion_limit": RECURSION_LIMIT}
        )
    except GraphRecursionError:  # kept calling tools: no answer
        return 0.0
    final = state["messages"][-1]
    answer = final.content if isinstance(final.content, str) else ""
    return 1.0 if not final.tool_calls and answer.strip() == task["answer"] else 0.0
