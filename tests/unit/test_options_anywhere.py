"""A group's own options after its command too (store/options_anywhere.py): `swarm ctl status --url U`,
`researcher status 3 --debug`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from store.options_anywhere import UsageError, hoist

CTL = ("--url", "--admin-token", "--timeout")


def test_options_after_the_command_move_before_it_in_order():
    args = ["policy", "add", "b", "lora_rank=8", "--url", "U", "--timeout=3", "--admin-token", "T"]
    assert hoist(args, CTL) == ["--url", "U", "--timeout=3", "--admin-token", "T", "policy", "add", "b", "lora_rank=8"]
    assert hoist(["--url", "A", "status", "--url", "B"], CTL) == ["--url", "A", "--url", "B", "status"]
    assert hoist(["status", "3", "-v", "--debug"], flags=("-v", "--debug")) == ["-v", "--debug", "status", "3"]


def test_nothing_after_a_double_dash_and_no_other_argument_is_moved():
    assert hoist(["set", "url=x", "--", "--url", "U"], CTL) == ["set", "url=x", "--", "--url", "U"]
    assert hoist(["set", "--policy", "p", "lr=1"], CTL) == ["set", "--policy", "p", "lr=1"]


def test_an_option_without_its_value_is_a_usage_error():
    with pytest.raises(UsageError, match="'--url' requires an argument"):
        hoist(["status", "--url"], CTL)


def test_researchers_debug_after_the_command(tmp_path, monkeypatch):
    from researcher.cli import app
    from researcher.planning import UnsupportedTopic

    monkeypatch.setenv("ROOST_HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["study", "Does Adam beat SGD?", "--dry-run", "--debug"])  # "No such option" before
    assert isinstance(r.exception, UnsupportedTopic)  # --debug: the error itself, its traceback kept
    r = CliRunner().invoke(app, ["study", "Does Adam beat SGD?", "--dry-run"])
    assert r.exit_code == 1 and "cannot study the optimizer" in r.output
