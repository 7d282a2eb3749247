"""Help text as a terminal shows it. typer (rich mode) joins the lines of a command's first paragraph
but keeps every single line break of the later ones, so a docstring wrapped at the source's 120
columns came out of `--help` ragged (a full line, then a word or two, at 80 columns). `unwrap_help(app)`
joins each later paragraph into one line that rich wraps to the terminal; a paragraph laid out on
purpose (click's `\\b` marker, indented or bulleted lines) keeps its breaks. In `store`, beside
`store.options_anywhere`, because every package's command line uses it. On/off switches lose typer's
`<bool>` metavar too (they take no value), `--help` included.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer

__all__ = ["unwrap_help", "unwrapped"]


def unwrapped(text: str) -> str:
    """Each paragraph of `text` on one line, but those laid out on purpose (see the module)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if _laid_out(p) else " ".join(p.split()) for p in paragraphs)


def _laid_out(paragraph: str) -> bool:
    lines = paragraph.split("\n")
    return paragraph.startswith("\b") or any(line[:1].isspace() or line.lstrip()[:2] in ("- ", "* ") for line in lines)


def unwrap_help(app: typer.Typer) -> typer.Typer:
    """Every command's help of `app` and its sub-apps unwrapped (call it once every command is registered),
    and its on/off switches shown without typer's `<bool>`, which reads as if they took a value."""
    _help_option_untyped()
    for info in app.registered_commands:
        text = info.help or inspect.getdoc(info.callback) or ""
        info.help = unwrapped(text) if text else info.help
        _no_bool_metavar(info.callback)
    if app.registered_callback is not None:  # the group's own options (`researcher --verbose`)
        _no_bool_metavar(app.registered_callback.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            unwrap_help(group.typer_instance)
    return app


def _no_bool_metavar(callback: object) -> None:
    for param in inspect.signature(callback).parameters.values() if callable(callback) else ():
        option = param.default
        if isinstance(option, typer.models.OptionInfo) and _is_bool(param.annotation) and option.metavar is None:
            option.metavar = ""


def _help_option_untyped() -> None:
    """`--help` without `<bool>` in every command's help. click makes the help option itself, when a command
    is shown (no callback parameter to reach as `_no_bool_metavar` does): its factory is wrapped, once."""
    for cls in (typer.core.TyperCommand, typer.core.TyperGroup):
        made = cls.get_help_option
        if getattr(made, "untyped", False):
            continue

        def get_help_option(self: Any, ctx: Any, made: Any = made) -> Any:
            option = made(self, ctx)
            if option is not None and option.metavar is None:
                option.metavar = ""
            return option

        get_help_option.untyped = True  # type: ignore[attr-defined]
        cls.get_help_option = get_help_option  # type: ignore[method-assign]


def _is_bool(annotation: object) -> bool:
    return annotation in (bool, "bool", bool | None, "bool | None")
