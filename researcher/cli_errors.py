"""How `researcher` fails: one line and a hint for an expected failure, a missing extra named.

Expected failures (an unreachable LLM endpoint, a planner answer still invalid after its retries, a
topic the planner cannot express, a budget too small for the design) print one line and a hint and exit
1; `researcher --debug ...` shows the traceback instead. Every command first checks for the `research`
extra (`require_research`), so an install without it is told what to install, not shown a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from researcher.cli_options import options_of
from swarm.config.options import require_extra

err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])
# What `researcher` needs beyond the `server` extra (roost[research] brings them with it): the study graph
# and its checkpoints, the LLM planner, the scheduler daemon, the statistics. Top-level module names.
RESEARCH_MODULES = ("langgraph", "langchain_core", "langchain_openai", "apscheduler", "scipy")


def require_research() -> None:
    """Exit with one line naming the missing modules and `pip install 'roost[research]'`.

    Every command calls it first, before it imports the study machinery: on a `[server]`
    install the import would otherwise end in a ModuleNotFoundError traceback.
    """
    require_extra("research", *RESEARCH_MODULES)


@functools.cache
def hints() -> dict[type[Exception], str]:
    """The expected failures and the hint printed under each.

    Built on first use: the LLM errors live in researcher.llm, which needs the research extra.
    """
    from researcher.llm import BudgetExceeded, LLMUnreachable, StructuredOutputError  # lazy: research extra
    from researcher.planning import BudgetTooSmall, UnsupportedTopic  # lazy: numpy, which a client lacks

    return {
        LLMUnreachable: "check that the endpoint is up and ROOST_LLM_BASE_URL / ROOST_LLM_MODEL / "
        "ROOST_LLM_API_KEY are right, or use --planner rules",
        StructuredOutputError: "try a stronger model (ROOST_LLM_MODEL), or --planner rules",
        UnsupportedTopic: "name one of these knobs and the values to compare, or use the LLM planner, which "
        "can use every knob (--planner llm; set ROOST_LLM_BASE_URL and ROOST_LLM_MODEL)",
        BudgetTooSmall: "raise --max-trials (or leave it out), or name fewer values to compare",
        BudgetExceeded: "raise --llm-tokens",
    }


def hint_for(e: Exception) -> str | None:
    """The hint of an expected failure; None for any other exception.

    Expected failures are the researcher's own exceptions: anything else (typer's exit of
    a missing extra included) passes through without importing researcher.llm.
    """
    if not type(e).__module__.startswith("researcher."):
        return None
    return next((hint for cls, hint in hints().items() if isinstance(e, cls)), None)


def fail(message: str, hint: str | None = None, code: int = 1) -> typer.Exit:
    """Print one clear error (and a hint); the caller raises what this returns."""
    first, _, rest = message.partition("\n")
    err.print(f"[bold red]error:[/] {escape(first)}")
    if rest:
        err.print(escape(rest), highlight=False)
    if hint:
        err.print(f"[yellow]hint:[/] {escape(hint)}")
    return typer.Exit(code)


def expected_errors(fn: F) -> F:
    """Known failures become `fail(...)`; anything else (or --debug) keeps its traceback.

    The command takes the invocation's `ctx: typer.Context`, which holds --debug.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            hint = hint_for(e)
            if hint is None or options_of(kwargs.get("ctx")).debug:  # typer passes parameters by name
                raise
            raise fail(str(e), hint) from None

    return wrapper  # type: ignore[return-value]


__all__ = ["RESEARCH_MODULES", "err", "expected_errors", "fail", "hint_for", "hints", "require_research"]
