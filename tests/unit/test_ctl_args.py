"""`swarm ctl`'s server options are taken before or after the command (swarm/ctl.py: hoist_server_options)."""

from __future__ import annotations

from swarm.ctl import hoist_server_options


def test_server_options_after_the_command_move_before_it_in_order():
    args = ["policy", "add", "b", "lora_rank=8", "--url", "U", "--timeout=3", "--admin-token", "T"]
    assert hoist_server_options(args) == [
        "--url",
        "U",
        "--timeout=3",
        "--admin-token",
        "T",
        "policy",
        "add",
        "b",
        "lora_rank=8",
    ]
    assert hoist_server_options(["--url", "A", "status", "--url", "B"]) == ["--url", "A", "--url", "B", "status"]


def test_nothing_after_a_double_dash_and_no_setting_is_moved():
    assert hoist_server_options(["set", "url=x", "--", "--url", "U"]) == ["set", "url=x", "--", "--url", "U"]
    assert hoist_server_options(["set", "--policy", "p", "lr=1"]) == ["set", "--policy", "p", "lr=1"]
