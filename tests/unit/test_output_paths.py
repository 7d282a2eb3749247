"""An output path a command was given (`swarm eval --json`, `swarm model export --merge`, `swarm inspect --html`),
refused in one line naming the option before the work, not with a traceback after it (swarm/output_paths.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from swarm.cli import app
from swarm.output_paths import output_problem, require_output, write_output


def _said(output: str) -> str:
    """rich's error box, unwrapped to one line."""
    return " ".join(output.replace("│", " ").split())


def test_a_file_path_is_checked_for_what_is_there_and_above_it(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert output_problem(tmp_path / "out.json") is None
    assert output_problem(tmp_path / "new" / "sub" / "out.json") is None  # folders to be made
    assert output_problem(afile) is None  # overwritten, as before
    assert output_problem(tmp_path) == f"{tmp_path} is a folder: name a file to write"
    assert output_problem(afile / "x.json") == f"cannot create {afile / 'x.json'}: {afile} is a file, not a folder"


def test_a_folder_path_is_checked_for_what_is_there_and_above_it(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert output_problem(tmp_path / "merged", folder=True) is None
    assert output_problem(tmp_path, folder=True) is None
    assert output_problem(afile, folder=True) == f"{afile} is a file, not a folder"
    assert "is a file, not a folder" in (output_problem(afile / "x", folder=True) or "")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_folder_that_takes_no_new_entries_is_tried_not_read_off_its_mode() -> None:
    """Root's permission bits say yes to /proc; making an entry there fails (ENOENT), as the later write would."""
    said = output_problem(Path("/proc/roost-x.json"))
    assert said is not None and said.startswith("cannot create /proc/roost-x.json: /proc takes no new entries (")
    assert not list(Path("/proc").glob(".roost-write-check-*"))


def test_require_output_names_the_option_and_write_output_makes_the_folders(tmp_path: Path) -> None:
    require_output(None, "--json")  # not given: nothing to check
    with pytest.raises(typer.BadParameter) as caught:
        require_output(tmp_path, "--json")
    assert caught.value.param_hint == "--json"
    write_output(tmp_path / "a" / "b" / "out.json", "[]")
    assert (tmp_path / "a" / "b" / "out.json").read_text() == "[]"
    assert not list(tmp_path.glob(".roost-write-check-*"))  # the probe leaves nothing behind


@pytest.mark.parametrize("target", ["folder", "afile/x.json"])
def test_eval_refuses_a_bad_json_path_before_it_evaluates(tmp_path: Path, target: str) -> None:
    """It printed the table, then IsADirectoryError / NotADirectoryError: the minutes of evaluation lost."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    out = tmp_path / target
    r = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "none"), "--json", str(out)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "Invalid value for --json" in _said(r.output), r.output
    assert "evaluation of" not in r.output  # refused first: the --model missing is not even reached


@pytest.mark.parametrize("target", ["afile", "afile/x", "/proc/roost-x"])
def test_export_refuses_a_bad_merge_path_before_it_loads_the_model(tmp_path: Path, target: str) -> None:
    """`--merge afile` was NotADirectoryError; `--merge /proc/x` blamed SOURCE after the merge."""
    (tmp_path / "afile").write_text("x")
    out = tmp_path / target if not target.startswith("/") else Path(target)
    r = CliRunner().invoke(
        app, ["model", "export", str(tmp_path / "none"), "--merge", str(out)], env={"COLUMNS": "300"}
    )
    said = _said(r.output)
    assert r.exit_code == 2 and "Invalid value for --merge" in said and "SOURCE" not in said, r.output


def test_eval_json_into_folders_not_made_yet(tmp_path: Path) -> None:
    """`--json nodir/sub/x.json` was FileNotFoundError after the evaluation: the folders are made."""
    from swarm.model.eval_cli import _plain_table, _show

    out = tmp_path / "nodir" / "sub" / "x.json"
    row = {"task": "arith", "temperature": 0.0, "n": 1, "mean_reward": 1.0, "solved": 1.0}
    rows = [{**row, "calls_per_episode": 1.0, "seconds": 0.1}]
    _show(_plain_table(rows, "t"), rows, out)
    assert json.loads(out.read_text()) == rows
