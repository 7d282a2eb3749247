"""swarm/config/unknown.py: a config file's unknown key is answered with the name meant, where one is near
or one level off, instead of pydantic's bare "Extra inputs are not permitted"."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from swarm.config.options import build_config
from swarm.config.run import RunConfig
from swarm.config.unknown import fields_at, places_of, unknown_setting


def _refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(typer.BadParameter) as exc:
        build_config(RunConfig, {}, config_file=path)
    return str(exc.value)


def test_a_misspelt_key_names_the_one_meant_at_every_depth(tmp_path):
    line = _refusal(tmp_path, "stpes: 3\nserver:\n  group_sise: 4\n  lora: {rank: 8, rnak: 3}\n")
    assert "stpes: not a setting; did you mean 'steps'?" in line
    assert "server.group_sise: not a setting; did you mean 'group_size'?" in line
    assert "server.lora.rnak: not a setting; did you mean 'rank'?" in line
    assert "Extra inputs" not in line


def test_a_key_one_level_off_names_where_it_goes(tmp_path):
    line = _refusal(tmp_path, "lr: 0.1\nserver:\n  rank: 4\n")
    assert "lr: not a setting here; it is server.train.lr" in line
    assert "server.rank: not a setting here; it is server.lora.rank" in line  # not 'train', the near miss


def test_items_of_a_list_are_walked_and_shown_as_such(tmp_path):
    line = _refusal(tmp_path, "server:\n  policies:\n    - name: a\n      lora: {rank: 8, alpah: 3}\n")
    assert "server.policies.0.lora.alpah: not a setting; did you mean 'alpha'?" in line
    assert any(p.startswith("server.policies[].") for p in places_of(RunConfig, "alpha"))


def test_nothing_near_lists_the_settings_there():
    message = unknown_setting(RunConfig, ("zzzz",))
    assert message.startswith("not a setting here (these are: task, ")
    assert fields_at(RunConfig, ("server", "lora")) == ["rank", "alpha", "targets", "dropout", "lr_scale"]
    assert fields_at(RunConfig, ("task",)) is None  # a plain value: nothing below it
    assert unknown_setting(RunConfig, ("task", "x")) == "not a setting"


def test_a_validators_refusal_reads_as_its_own_text(tmp_path):
    """pydantic prefixes a validator's ValueError with "Value error, ": the user sees the text alone."""
    line = _refusal(tmp_path, "task: nope\n")
    assert "unknown task 'nope'" in line and "Value error" not in line


def test_a_whole_config_check_is_its_own_words_without_the_models_name(tmp_path):
    line = _refusal(tmp_path, "server:\n  group_size: 1\n")
    assert line == "--group-size must be at least 2: a group baseline needs two episodes"  # "RunConfig: " before
