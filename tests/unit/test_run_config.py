"""RunConfig's own refusals of what a user may type (the rest are covered where the run uses them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.config.run import RunConfig


@pytest.mark.parametrize("given", ["http://127.0.0.1:8000", Path("http://127.0.0.1:8000"), "https://host/x"])
def test_attach_refuses_a_url_and_says_it_takes_the_servers_out_folder(given: object) -> None:
    with pytest.raises(ValueError, match="the out folder of a running `swarm serve`, not a URL"):
        RunConfig(attach=given)


def test_attach_takes_a_folder_named_like_a_host() -> None:
    assert RunConfig(attach="runs/http-server").attach == Path("runs/http-server")
