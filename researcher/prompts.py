"""Prompt templates: versioned text files in the repository's `prompts/` directory.

    render("frame", topic="...", schema="...")     # highest version of prompts/frame.vN.txt
    load("frame", version=1)

`ROOST_PROMPTS_DIR` points elsewhere (a user's own prompt set). Placeholders are
`$name` (`string.Template`): JSON braces in a prompt need no escaping.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from string import Template

import prompts as prompts_package  # the top-level package: works from a checkout and from an installed wheel

ENV_DIR = "ROOST_PROMPTS_DIR"
_NAME = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<version>\d+)\.txt$")


def prompts_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    return Path(prompts_package.__file__).resolve().parent


def versions(name: str) -> list[int]:
    found = []
    for p in prompts_dir().glob(f"{name}.v*.txt"):
        m = _NAME.match(p.name)
        if m and m.group("name") == name:
            found.append(int(m.group("version")))
    return sorted(found)


def load(name: str, version: int | None = None) -> tuple[str, int]:
    """(template text, version); the highest version unless one is asked for."""
    available = versions(name)
    if not available:
        raise FileNotFoundError(f"no prompt {name!r} in {prompts_dir()} (expected {name}.v1.txt)")
    v = version if version is not None else available[-1]
    return (prompts_dir() / f"{name}.v{v}.txt").read_text(), v


def render(name: str, version: int | None = None, **values: object) -> str:
    """The template filled in; a missing placeholder raises KeyError (no silent gaps)."""
    text, _ = load(name, version)
    return Template(text).substitute({k: str(v) for k, v in values.items()})
