"""An output path the user named (`--json`, `--html`, `--merge`), checked before the work that fills it.

    require_output(json_out, "--json")              # before minutes of evaluation, not after them
    require_output(merge, "--merge", folder=True)   # a folder to be made (or an empty one)
    write_output(json_out, text)                    # makes the missing folders above it

A command that works for minutes and only then finds it cannot write its result loses the minutes,
with a traceback for a message (`swarm eval --json /tmp`: a folder; `--json nodir/x.json`; `--merge
afile`: a file). These checks run first and say what is wrong in one line naming the option. A path
whose folders do not exist yet is fine when the nearest existing one takes new entries: that is
tried (a probe folder made and removed), not read off the permission bits, which say yes to root
everywhere, /proc included.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import typer

__all__ = ["output_problem", "require_output", "write_output"]


def output_problem(path: Path, folder: bool = False) -> str | None:
    """Why `path` cannot be written (a file, or with `folder` a folder of files), or None if it can."""
    if path.exists():
        if folder and not path.is_dir():
            return f"{path} is a file, not a folder"
        if not folder and path.is_dir():
            return f"{path} is a folder: name a file to write"
        writable = _takes_entries(path) is None if folder else os.access(path, os.W_OK)
        return None if writable else f"{path} is not writable"
    nearest = next(p for p in path.absolute().parents if p.exists())
    if not nearest.is_dir():
        return f"cannot create {path}: {nearest} is a file, not a folder"
    if (refused := _takes_entries(nearest)) is not None:
        return f"cannot create {path}: {nearest} takes no new entries ({refused})"
    return None


def _takes_entries(folder: Path) -> str | None:
    """None if a new entry can be made in `folder`, else the system's reason."""
    try:
        Path(tempfile.mkdtemp(prefix=".roost-write-check-", dir=folder)).rmdir()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def require_output(path: Path | None, option: str, folder: bool = False) -> None:
    """typer's one-line `Invalid value for OPTION: ...` (exit 2) when `path` cannot be written; None: not given."""
    if path is not None and (problem := output_problem(path, folder)) is not None:
        raise typer.BadParameter(problem, param_hint=option)


def write_output(path: Path, text: str) -> None:
    """`text` into `path`, the folders above it made first (`require_output` checked they can be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
