"""What to say of a setting a config model does not have: the nearest known name, or the known ones.

Why: pydantic's own line for a misspelt key in a config file, `server.lora.rnak: Extra inputs are
not permitted`, says it is wrong but not what is right, and a key put at the wrong level
(`train: {lr: ...}` where the run's settings are flat) reads the same. The fields of the model at
the key's place are known, so the line can name them.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel

#: at most this many known names are listed when none is near the one given
MOST_LISTED = 16


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The config model an annotation holds (`X`, `X | None`, `list[X]`, `Annotated[X, ...]`), if one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        for arg in typing.get_args(annotation):
            if (found := _model_of(arg)) is not None:
                return found
    return None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return None
        field = current.model_fields.get(str(part)) if isinstance(part, str) else None
        if field is None:
            continue  # a list index or a mapping key: the same model goes on
        current = _model_of(field.annotation)
    return current


def fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The field names of the model reached from `model` by `loc` (list indices and dict keys skipped)."""
    current = _model_at(model, loc)
    return list(current.model_fields) if current is not None else None


def places_of(model: type[BaseModel], name: str, depth: int = 3) -> list[str]:
    """The dotted places below `model` where `name` is a setting (`train` -> `server.train`)."""
    found: list[str] = []
    for field, info in model.model_fields.items():
        inner = _model_of(info.annotation)
        if inner is None or depth <= 0:
            continue
        here = f"{field}[]" if "list[" in str(info.annotation) else field  # each item of a list: `policies[]`
        if name in inner.model_fields:
            found.append(f"{here}.{name}")
        found += [f"{here}.{p}" for p in places_of(inner, name, depth - 1)]
    return found


def unknown_setting(model: type[BaseModel], loc: tuple[Any, ...], noun: str = "setting") -> str:
    """The message for `loc`, a key `model` forbids: `not a setting; did you mean 'rank'?` (`noun`: what
    the keys are called where it is read: a config file's settings, a request body's fields)."""
    known = fields_at(model, loc[:-1])
    if not known:
        return f"not a {noun}"
    below = _model_at(model, loc[:-1])
    if below is not None and (places := places_of(below, str(loc[-1]))):  # the right name one level off
        prefix = "".join(f"{p}." for p in loc[:-1] if isinstance(p, str))
        return f"not a {noun} here; it is {' or '.join(prefix + p for p in places[:3])}"
    near = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if near:
        return f"not a {noun}; did you mean {near[0]!r}?"
    listed = ", ".join(known[:MOST_LISTED]) + (", ..." if len(known) > MOST_LISTED else "")
    return f"not a {noun} here (these are: {listed})"


def name_unknown_keys(
    errors: list[dict[str, Any]], model: type[BaseModel], noun: str = "setting", under: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Pydantic's errors with each unknown key's message (`extra_forbidden`) saying the name meant; `under`:
    the prefix of `loc` that is not the model's (a request's `body`), only errors under it are renamed."""
    return [
        {**e, "msg": unknown_setting(model, tuple(e["loc"])[len(under) :], noun)}
        if e.get("type") == "extra_forbidden" and tuple(e.get("loc", ()))[: len(under)] == under
        else e
        for e in errors
    ]


__all__ = ["fields_at", "name_unknown_keys", "places_of", "unknown_setting"]
