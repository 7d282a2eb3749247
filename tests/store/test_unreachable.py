"""A store that cannot be opened is one line and an exit code from every command line (store/unreachable.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, text

from store.unreachable import run_app

DOWN = "postgresql://u:secret@127.0.0.1:1/x"  # port 1: nothing listens; refused at once


def _open(url: str) -> None:
    with create_engine(url).connect() as conn:
        conn.execute(text("select 1"))


def test_a_refused_server_and_a_url_naming_nothing(capsys):
    with pytest.raises(SystemExit) as e:
        run_app(lambda: _open(DOWN))
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("error: cannot open the database: ") and "refused" in err
    assert "hint: the database is the command's --db (or --url), else ROOST_DATABASE_URL" in err
    with pytest.raises(SystemExit) as e:
        run_app(lambda: _open("nope://x"))
    assert e.value.code == 2 and "the database URL is not one the store can open" in capsys.readouterr().err


def test_other_errors_and_debug_keep_their_traceback():
    with pytest.raises(KeyError):
        run_app(lambda: {}["x"])
    with pytest.raises(Exception, match="refused"):
        run_app(lambda: _open(DOWN), debug=True)


@pytest.mark.parametrize(
    "argv", [["-m", "swarm", "sched", "status"], ["-m", "researcher", "status"], ["-m", "swarm", "db", "current"]]
)
def test_each_command_line_says_it_in_a_line(argv, tmp_path):
    env = {**os.environ, "ROOST_DATABASE_URL": DOWN, "ROOST_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "cannot open" in r.stderr and "refused" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "secret" not in r.stderr
