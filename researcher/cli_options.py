"""How `researcher`'s commands read their options: the root options, and `study`'s derived from StudyConfig.

A study setting is written once, as a StudyConfig field (type, default, bound, help);
`setting()` makes the typer option from it, so the command line cannot drift from a
study built in code. Options the model stores in another form (durations as text,
'1h' for 3600 s) still take their default from the field. The root options live in
typer's context (`ctx.obj`), not in module state: CliRunner runs many invocations in
one process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import annotated_types
import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from researcher.config import StudyConfig, parse_duration
from swarm.config.options import errors_line


@dataclass(frozen=True)
class CliOptions:
    """The root options, handed to every command in typer's context (`ctx.obj`)."""

    debug: bool = False


def options_of(ctx: typer.Context | None) -> CliOptions:
    """The root options of the invocation `ctx` belongs to (the defaults without one)."""
    opts = ctx.find_object(CliOptions) if ctx is not None else None
    return opts if opts is not None else CliOptions()


def config_field(path: str) -> FieldInfo:
    """StudyConfig's field at a dotted path into its nested models (`budget.max_trials`)."""
    model: Any = StudyConfig
    *parents, name = path.split(".")
    for parent in parents:
        model = model.model_fields[parent].annotation
    return model.model_fields[name]


def setting(path: str, *names: str, text: Callable[[Any], str] | None = None, **kw: Any) -> Any:
    """A typer option for a StudyConfig field: default, lower bound and help are the field's.

    `text` turns the default into what the option reads (seconds → '1h'); an explicit
    `help` wins where the command line needs more words than the model.
    """
    info = config_field(path)
    default = info.get_default(call_default_factory=True)
    if text is not None:
        default = None if default is None else text(default)
    else:  # an exclusive bound (gt) has no typer equivalent: the model checks it (usage_error)
        low = next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None)
        if low is not None:
            kw.setdefault("min", low)
    kw.setdefault("help", info.description)
    return typer.Option(default, *names, **kw)


def usage_error(e: ValidationError) -> typer.BadParameter:
    """A bound typer could not check (poll > 0, hours > 0) as a usage error, not a traceback."""
    return typer.BadParameter(errors_line(e.errors(), most=None))


def duration(value: str | None) -> str | None:
    """Typer callback: a malformed duration is a usage error naming the option, not a traceback."""
    try:
        parse_duration(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return value


def deadline_param(value: str | None) -> str | None:
    """Typer callback: checked when given, so a typo fails before any planning."""
    if value:
        try:
            when = parse_deadline(value)
        except ValueError:
            raise typer.BadParameter(
                f"not a time or a duration: {value!r} (use e.g. 2030-01-31T18:00, 90m, 6h)"
            ) from None
        if when is not None and when <= datetime.now(UTC):  # a study that could launch nothing, "completed"
            raise typer.BadParameter(f"{value} has passed already: give a time to come, or a duration (6h)")
    return value


def parse_deadline(text: str | None) -> datetime | None:
    """An ISO time (UTC when naive) or a duration from now."""
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text)
        return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    except ValueError:
        secs = parse_duration(text)
        assert secs is not None
        return datetime.now(UTC) + timedelta(seconds=secs)
