"""What the schemathesis tests share: one bounded hypothesis run per operation and mode, and the
check every answer must pass (no 5xx; a 4xx carries the `error` object with a message and a type).

Imported by name (the root conftest puts this folder on sys.path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

MODES = ("POSITIVE", "NEGATIVE")


def _runner(strategy: Any, body: Callable[[Any], None], max_examples: int) -> Callable[[], None]:
    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        body(case)

    return run


def _nothing_to_break(op: Any) -> bool:
    """No body, and only path and header parameters that take any string (a header optional too): no
    case can violate the schema, and hypothesis would search for one until it gives up (for 25 of the
    44 operations, 60 % of the fuzz's time)."""
    if op.body:
        return False
    anything = ({}, {"type": "string"}, {"anyOf": [{"type": "string"}, {"type": "null"}]})
    for p in op.iter_parameters():
        schema = {k: v for k, v in (p.definition.get("schema") or {}).items() if k not in ("title", "description")}
        if str(p.location.value) not in ("path", "header") or schema not in anything:
            return False
    return True


def fuzz_operations(
    schemathesis: Any, ops: list[Any], send: Callable[[Any, Any], None], max_examples: int, failures: list[str]
) -> list[str]:
    """Run `send(op, case)` on `max_examples` generated cases of each operation, schema-valid and
    schema-violating, derandomized; the operations that had no violating case to make."""
    skipped: list[str] = []
    for op in ops:
        for mode in MODES:
            if mode == "NEGATIVE" and _nothing_to_break(op):
                skipped.append(f"{op.method.upper()} {op.path}")
                continue
            strategy = op.as_strategy(generation_mode=getattr(schemathesis.GenerationMode, mode))
            try:
                _runner(strategy, lambda case, op=op: send(op, case), max_examples)()
            except Unsatisfiable:
                if mode != "NEGATIVE":
                    raise
                skipped.append(f"{op.method.upper()} {op.path}")  # nothing in it can be made invalid
            except Exception as exc:  # generation trouble is a test bug; report it with the operation
                failures.append(f"{op.method.upper()} {op.path} ({mode}): {type(exc).__name__}: {exc}"[:800])
    return skipped


def check_answer(name: str, response: Any, failures: list[str], sent: str = "", code: bool = False) -> None:
    """No 5xx (reported with what was `sent`), and a 4xx in the error shape (`code`: with an
    `error.code` too)."""
    status = response.status_code
    if status >= 500:
        failures.append(f"{name}: {status} {response.text[:300]} for {sent[:600]}")
    elif status >= 400:
        try:
            err = response.json()["error"]
            assert isinstance(err["message"], str) and err["type"] and (err["code"] or not code)
        except Exception:
            failures.append(f"{name}: {status} without the error shape: {response.text[:200]}")
