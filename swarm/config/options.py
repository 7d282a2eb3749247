"""Command-line options and config files derived from the pydantic config models.

A setting is written once: as a field of its config model (`ServerConfig`,
`TrainConfig`, `FleetConfig`, `RunConfig`), with its type, default, bounds and
help text. From that one definition this module derives

* the typer options of a command (`config_options(Model)` decorates it): one
  `--flag` per scalar field, nested models flattened, help and default shown
  from the model, bounds checked by the model's own validation;
* the config-file round trip (`load_config_file`, `build_config`,
  `write_config`): a run writes the config it ran with into its directory, and
  `--config that-file` repeats it;
* the researcher's knob list (`leaves(RunConfig)`, in researcher/experiment.py).

Field metadata that only the command line needs (another flag name, a short
alias, an environment variable, "0 means off", the help panel) rides in
`Annotated[..., Flag()]`. `--help` groups the options in panels: a field's panel
is its `Flag(panel=...)`, else the `cli_panel` of the model it is a field of, else
its parent model's (`PANEL_ORDER` orders them).

    class FleetConfig(BaseModel):
        concurrency: Annotated[int, Flag(short="-c")] = Field(8, ge=1, description="episodes in flight")

    @config_options(FleetConfig)
    def client_command(overrides: dict, config_file: Path | None = None) -> None: ...
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import inspect
import json
import re
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic import BaseModel, ValidationError
from rich.markup import escape

from swarm.config.unknown import name_unknown_keys

SECRET_FIELDS = frozenset({"token", "admin_token", "secret"})


@dataclass(frozen=True)
class Flag:
    """How a config field appears on the command line and to the researcher."""

    name: str | None = None  # the long flag; default --field-name
    short: str | None = None
    off: str | None = None  # a bool's negative flag; default --no-<name>
    envvar: str | None = None
    zero_is_none: bool = False  # the flag's 0 means None (off) in the model
    default_text: str | None = None  # shown instead of a computed default (paths, secrets)
    cli: bool = True  # False: config files only
    knob: str | None = None  # the researcher's name for it; default the field name
    study: tuple[float, float] | None = None  # the range a study may explore (narrower than validity)
    studied: bool = True  # False: not a researcher knob (paths, ports, secrets, logging)
    panel: str | None = None  # the --help panel; default the model's `cli_panel`


#: the order of `--help` panels: what the run is and what plays in it first, the engines only some runs
#: use last (a panel not named here comes after these, in field order)
PANEL_ORDER = ("run", "task and fleet", "server", "training", "engine: vLLM", "engine: verl")


@dataclass(frozen=True)
class Leaf:
    """One scalar setting of a (possibly nested) config model."""

    path: tuple[str, ...]
    annotation: Any  # the field's type, Optional stripped
    optional: bool
    default: Any
    description: str
    flag: Flag
    bounds: tuple[float | None, float | None]
    panel: str = "Options"

    @property
    def param(self) -> str:
        return "__".join(self.path)

    @property
    def option(self) -> str:
        return self.flag.name or "--" + self.path[-1].replace("_", "-")

    @property
    def knob(self) -> str:
        return self.flag.knob or self.path[-1]


def _flag(info: Any) -> Flag:
    return next((m for m in info.metadata if isinstance(m, Flag)), Flag())


def _bounds(info: Any) -> tuple[float | None, float | None]:
    low = high = None
    for m in info.metadata:  # annotated_types' Ge/Gt/Le/Lt, as pydantic keeps them
        low = getattr(m, "ge", getattr(m, "gt", low))
        high = getattr(m, "le", getattr(m, "lt", high))
    return low, high


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else annotation), True
    return annotation, False


def _scalar(annotation: Any) -> bool:
    return annotation in (bool, int, float, str, Path) or (
        isinstance(annotation, type) and issubclass(annotation, enum.Enum)
    )


def leaves(
    model: type[BaseModel], defaults: BaseModel | None = None, prefix: tuple[str, ...] = (), panel: str = "Options"
) -> Iterator[Leaf]:
    """Every scalar field of `model`, nested models flattened (defaults from `defaults` when given)."""
    panel = getattr(model, "cli_panel", None) or panel
    for name, info in model.model_fields.items():
        annotation, optional = _strip_optional(info.annotation)
        default = getattr(defaults, name) if defaults is not None else info.get_default(call_default_factory=True)
        flag = _flag(info)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from leaves(annotation, default, prefix + (name,), flag.panel or panel)
        elif _scalar(annotation):
            yield Leaf(
                prefix + (name,),
                annotation,
                optional,
                default,
                info.description or "",
                flag,
                _bounds(info),
                flag.panel or panel,
            )


def _show(leaf: Leaf) -> str:
    if leaf.flag.default_text is not None:
        return leaf.flag.default_text
    value = leaf.default
    if value is None:
        return "off" if leaf.flag.zero_is_none else "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return (leaf.option if value else (leaf.flag.off or "--no-" + leaf.option[2:])).lstrip("-")
    if value == "":
        return "''"  # an empty string, shown as one rather than as nothing
    return repr(value) if isinstance(value, float) else str(value)


def _param(leaf: Leaf) -> inspect.Parameter:
    names = [leaf.option]
    if leaf.annotation is bool:
        names = [f"{leaf.option}/{leaf.flag.off or '--no-' + leaf.option[2:]}"]
    if leaf.flag.short:
        names.append(leaf.flag.short)
    help_text = (
        leaf.description
        + _choices(leaf)
        + (" (0: off)" if leaf.flag.zero_is_none else "")
        + f" [default: {_show(leaf)}]"
    )
    # The option's own default stays None (so a given flag is told from an absent one); the model's
    # default goes into the help, escaped, since typer's rich help reads brackets as markup. The type
    # column is one column of the whole panel, so one wide entry narrows every description beside it:
    # an on/off switch shows no type (its `--x` / `--no-x` say it), a choice shows `<choice>`.
    metavar = "" if leaf.annotation is bool else "<choice>" if _is_enum(leaf.annotation) else None
    option = typer.Option(
        None,
        *names,
        help=escape(help_text.strip()),
        envvar=leaf.flag.envvar,
        show_default=False,
        show_envvar=bool(leaf.flag.envvar),
        rich_help_panel=leaf.panel,
        metavar=metavar,
    )
    return inspect.Parameter(
        leaf.param,
        inspect.Parameter.KEYWORD_ONLY,
        default=option,
        annotation=typing.Optional[leaf.annotation],  # noqa: UP045 (built at run time from a field type)
    )


def _is_enum(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, enum.Enum)


def _choices(leaf: Leaf) -> str:
    """`; one of: a, b, c` for a choice whose description does not already name each value."""
    if not _is_enum(leaf.annotation):
        return ""
    values = [str(m.value) for m in leaf.annotation]
    named = all(re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", leaf.description) for v in values)
    return "" if named else f"; one of: {', '.join(values)}"


def cli_leaves(
    model: type[BaseModel], defaults: BaseModel | None = None, exclude: frozenset[str] = frozenset()
) -> list[Leaf]:
    """The leaves a command exposes: `exclude` names dotted paths (`server.port`) or whole prefixes."""
    out = []
    for leaf in leaves(model, defaults):
        dotted = ".".join(leaf.path)
        if not leaf.flag.cli or any(dotted == e or dotted.startswith(e + ".") for e in exclude):
            continue
        out.append(leaf)
    return out


def config_options(
    model: type[BaseModel], defaults: BaseModel | None = None, exclude: frozenset[str] = frozenset()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command taking `overrides: dict` so it gets one option per exposed field.

    `overrides` holds only what the user gave (flags or their environment
    variables), nested like the model (`{"train": {"lr": 0.1}}`), so a config
    file's values survive wherever no flag was given.
    """
    exposed = cli_leaves(model, defaults, exclude)
    first_panel = getattr(model, "cli_panel", None) or "Options"

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != "overrides"]
        for p in own:  # the command's own options (--config, --resume...) head its first panel
            _own_option(p, first_panel)
        clash = {p.name for p in own} & {leaf.param for leaf in exposed}
        if clash:
            raise TypeError(f"{fn.__name__}: parameters {sorted(clash)} shadow config fields")

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            overrides: dict[str, Any] = {}
            for leaf in exposed:
                value = kwargs.pop(leaf.param, None)
                if value is None:
                    continue
                if leaf.flag.zero_is_none and value == 0:
                    value = None
                if isinstance(value, enum.Enum):
                    value = value.value
                _set(overrides, leaf.path, value)
            return fn(overrides=overrides, **kwargs)

        params = own + [_param(leaf) for leaf in sorted(exposed, key=_panel_rank)]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer must read the signature above, not fn's
        command.exposed = exposed  # type: ignore[attr-defined]
        return command

    return decorate


def _panel_rank(leaf: Leaf) -> int:
    return PANEL_ORDER.index(leaf.panel) if leaf.panel in PANEL_ORDER else len(PANEL_ORDER)


def _own_option(param: inspect.Parameter, panel: str) -> None:
    """Put a command's own option in `panel` unless it names one; an on/off one loses typer's <bool>."""
    info = param.default
    if not isinstance(info, typer.models.OptionInfo):
        return
    if info.rich_help_panel is None:
        info.rich_help_panel = panel
    if param.annotation in (bool, "bool") and info.metavar is None:
        info.metavar = ""


def require_extra(extra: str, *modules: str) -> None:
    """Exit with one line naming the extra to install when a heavy dependency is missing.

    A client-only install (`pip install roost`) has no torch, FastAPI or MLflow: the
    commands that need them say so instead of printing an ImportError traceback.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        typer.echo(f"this command needs {', '.join(missing)}: pip install 'roost[{extra}]'", err=True)
        raise typer.Exit(1)


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def deep_merge(base: dict[str, Any], top: dict[str, Any], keep_set: bool = False) -> dict[str, Any]:
    """`top` over `base`, recursing into mappings present in both. `keep_set`: a mapping of `top` does not
    replace a value of `base` that is set but no mapping (a config file's `server: 5` under the flags'
    `server: {group_size: 2}`): it stays for the model to refuse, as it is without a flag, instead of the
    flags' settings hiding it."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value, keep_set)
        elif not (keep_set and isinstance(value, dict) and out.get(key) is not None):
            out[key] = value
    return out


def load_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON mapping of config fields (validated later, with the flags on top)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
    else:
        try:
            data = yaml.safe_load(text)  # safe_load: plain data only, never objects or code
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of settings, not {type(data).__name__}")
    return data


def flag_names(model: type[BaseModel], defaults: BaseModel | None = None) -> dict[tuple[str, ...], str]:
    return {leaf.path: leaf.option for leaf in leaves(model, defaults)}


def errors_line(
    errors: Iterable[Mapping[str, Any]], place: Callable[[tuple[str, ...]], str] = ".".join, most: int | None = 5
) -> str:
    """Pydantic's errors as one line, `place: message; ...` (the first `most`), each place written by
    `place` from the error's `loc`: what a CLI, a config file and an HTTP 400 all print."""
    parts = []
    for err in list(errors)[:most]:
        where = place(tuple(str(p) for p in err.get("loc", ())))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")  # a validator's ValueError: its text
        parts.append(f"{where}: {msg}" if where else str(msg))
    return "; ".join(parts)


def describe_error(
    exc: ValidationError,
    model: type[BaseModel],
    defaults: BaseModel | None = None,
    file: Mapping[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> str:
    """A pydantic error as the user typed it: `--lease-seconds: Input should be greater than 0` for a flag,
    `server.train.lr: ...` for a value of the config file `file` that no flag of `flags` replaced (its
    flag would send the user to a command line that never held it)."""
    names = flag_names(model, defaults)
    errors = name_unknown_keys(list(exc.errors()), model)

    def place(loc: tuple[str, ...]) -> str:
        if file is not None and _holds(file, loc) and not _holds(flags or {}, loc):
            return ".".join(loc)
        return names.get(loc) or ".".join(loc)

    # a whole-model check (empty loc) names its flags in its own words: no "RunConfig: " before them
    return errors_line(errors, place, most=None)


def _holds(tree: Any, loc: tuple[str, ...]) -> bool:
    """Whether settings `tree` (a config file's, the flags') give a value at `loc` (pydantic's error place)."""
    for part in loc:
        if isinstance(tree, Mapping) and part in tree:
            tree = tree[part]
        elif isinstance(tree, list) and part.isdigit() and int(part) < len(tree):
            tree = tree[int(part)]
        else:
            return False
    return True


def build_config(
    model: type[BaseModel],
    overrides: dict[str, Any],
    config_file: Path | None = None,
    defaults: BaseModel | None = None,
) -> Any:
    """The model from `defaults`, then the file, then the flags; a CLI error naming the setting."""
    data: dict[str, Any] = defaults.model_dump(mode="json") if defaults is not None else {}
    file: dict[str, Any] | None = None
    try:
        if config_file is not None:
            file = load_config_file(config_file)
            data = deep_merge(data, file)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    data = deep_merge(data, overrides, keep_set=True)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise typer.BadParameter(
            describe_error(exc, model, defaults, file, overrides), param_hint="--config" if config_file else None
        ) from None


def dump_config(config: BaseModel, exclude: frozenset[str] = SECRET_FIELDS) -> dict[str, Any]:
    """JSON-able settings without secrets (they live in the run's secrets.json, mode 0600)."""
    return _without(config.model_dump(mode="json"), exclude)


def _without(data: Any, exclude: frozenset[str]) -> Any:
    if isinstance(data, dict):
        return {k: _without(v, exclude) for k, v in data.items() if k not in exclude}
    return data


def write_config(path: Path, config: BaseModel, exclude: frozenset[str] = SECRET_FIELDS) -> Path:
    """Write the settings a run uses as YAML (atomically), so `--config path` repeats it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(
        f"# {type(config).__name__}: repeat this run with --config {path.name}\n"
        + yaml.safe_dump(dump_config(config, exclude), sort_keys=False)
    )
    tmp.replace(path)
    return path


__all__ = [
    "PANEL_ORDER",
    "Flag",
    "Leaf",
    "build_config",
    "cli_leaves",
    "config_options",
    "deep_merge",
    "describe_error",
    "dump_config",
    "leaves",
    "load_config_file",
    "require_extra",
    "write_config",
]
