"""`swarm sched` (scheduler.cli): submit, status, logs, cancel, ticks — in-process with CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from scheduler.cli import app

runner = CliRunner()


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def test_status_of_no_jobs_says_how_to_submit_one(db_url: str) -> None:
    assert _run("status", "--db", db_url) == "No jobs yet; submit one with: swarm sched submit NAME -- COMMAND...\n"
    assert _run("status", "--db", db_url, "--json") == ""  # a script reads no rows


def test_submit_wait_status_logs(db_url: str, tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        [
            "submit",
            "--db",
            db_url,
            "--log-dir",
            str(tmp_path),
            "--wait",
            "-e",
            "WHO=cli",
            "greet",
            "bash",
            "-c",
            'echo "hi $WHO"; exit 2',
        ],
    )
    assert res.exit_code == 2, res.output  # --wait exits with the job's code
    job_id = int(res.output.split()[0])
    rows = [json.loads(line) for line in _run("status", "--db", db_url, "--json").splitlines()]
    assert rows[0]["id"] == job_id and rows[0]["state"] == "FAILED" and rows[0]["exit_code"] == 2
    assert _run("logs", str(job_id), "--db", db_url) == "hi cli\n"
    table = _run("status", str(job_id), "--db", db_url, "--no-refresh")
    assert "greet" in table and "FAILED" in table


def test_cancel_by_id_and_group(db_url: str, tmp_path: Path) -> None:
    a = int(_run("submit", "--db", db_url, "--log-dir", str(tmp_path), "--group", "g", "a", "sleep", "30").strip())
    b = int(_run("submit", "--db", db_url, "--log-dir", str(tmp_path), "--group", "g", "b", "sleep", "30").strip())
    c = int(_run("submit", "--db", db_url, "--log-dir", str(tmp_path), "c", "sleep", "30").strip())
    _run("cancel", str(c), "--db", db_url, "--force")
    _run("cancel", "--group", "g", "--db", db_url, "--force")
    rows = {r["id"]: r for r in map(json.loads, _run("status", "--db", db_url, "--json").splitlines())}
    assert {rows[i]["state"] for i in (a, b, c)} == {"CANCELLED"}


def test_bad_input(db_url: str) -> None:
    assert runner.invoke(app, ["cancel", "--db", db_url]).exit_code != 0
    assert runner.invoke(app, ["submit", "--db", db_url, "-e", "NOEQUALS", "x", "true"]).exit_code != 0


def _refused(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 2, res.output
    return " ".join(res.output.replace("│", " ").split())  # rich's error box, unwrapped


def test_an_unknown_job_backend_or_name_is_a_usage_error_not_a_traceback(db_url: str, tmp_path: Path) -> None:
    """Each of these was a KeyError or pydantic traceback."""
    for args in (["logs", "99"], ["status", "99"], ["cancel", "99"]):
        assert "no job 99 (`swarm sched status` lists" in _refused(*args, "--db", db_url)
    a = int(_run("submit", "--db", db_url, "--log-dir", str(tmp_path), "a", "sleep", "30").strip())
    assert "no job 99" in _refused("cancel", str(a), "99", "--db", db_url)
    rows = [json.loads(line) for line in _run("status", str(a), "--db", db_url, "--json").splitlines()]
    assert rows[0]["state"] != "CANCELLED"  # no id is acted on before every id is known
    _run("cancel", str(a), "--db", db_url, "--force")
    said = _refused("submit", "--db", db_url, "--backend", "nope", "x", "--", "true")
    assert "'nope': not a backend; local or slurm" in said
    said = _refused("submit", "--db", db_url, ".x", "true")
    assert "NAME '.x': 1 to 100 letters, digits, _ . or -, beginning with a letter or digit" in said
    said = _refused("submit", "--db", db_url, "-e", "1X=2", "x", "--", "true")
    assert "--env: not a valid environment variable name: '1X'" in said


def test_ticks_listing(db_url: str) -> None:
    from scheduler.daemon import register_tick

    register_tick("s1", "sched_ticks:touch", 60, kwargs={"path": "/dev/null"}, db_url=db_url)
    assert "s1\tsched_ticks:touch\tevery 60 s" in _run("ticks", "--db", db_url)


def test_submit_takes_options_anywhere_before_dashes(db_url: str, tmp_path: Path) -> None:
    """`swarm sched submit hello --wait -- echo hi`: the options are the scheduler's, the rest the job's."""
    res = runner.invoke(
        app,
        [
            "submit",
            "hello",
            "--db",
            db_url,
            "--log-dir",
            str(tmp_path),
            "--wait",
            "--",
            "bash",
            "-c",
            "echo hi; exit 3",
        ],
    )
    assert res.exit_code == 3, res.output
    job_id = int(res.output.split()[0])
    assert _run("logs", str(job_id), "--db", db_url) == "hi\n"
