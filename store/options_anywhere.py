"""A command group whose own options may also follow its command: `swarm ctl status --url U`,
`researcher status 3 --debug`, `swarm db current --db U`, as kubectl and git take their global flags.
In `store`, beside `store.lazy`, because every package's command line uses it and `store` is the one
package all of them may import.

click reads a group's options only before the command's name and answers "No such option" for
one after it, although the user said exactly what they meant. `options_anywhere(...)` gives a
`TyperGroup` that moves those options (with their values) to the front before parsing; their
order is kept, so of two the last still wins as click's rule has it. Nothing after `--` moves.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

try:  # a typer that carries its own click (typer._click): its exceptions and Context, not `click`'s
    from typer._click.core import ParameterSource
    from typer._click.exceptions import UsageError
except ImportError:  # an older typer runs on `click` itself
    from click.core import ParameterSource
    from click.exceptions import UsageError


__all__ = ["ParameterSource", "UsageError", "hoist", "options_anywhere"]


def hoist(args: list[str], with_value: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> list[str]:
    """`args` with the options named moved to the front: `with_value` take the next argument
    (or `--name=value`), `flags` none."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name in with_value:
            take = 1 if "=" in arg else 2
            if i + take > len(args):
                raise UsageError(f"Option '{arg}' requires an argument.")
            front += args[i : i + take]
            i += take
            continue
        if arg in flags:
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def options_anywhere(with_value: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> type[TyperGroup]:
    """A `TyperGroup` (for `typer.Typer(cls=...)`) that takes these group options after its command too."""

    class OptionsAnywhere(TyperGroup):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            return super().parse_args(ctx, hoist(args, with_value, flags))

    return OptionsAnywhere
