"""The README's commands run as written, from a fresh directory, and do what the README says they do.

The commands are read from the README itself (its fenced `bash` blocks in RUN_SECTIONS), so
an edit of a command there is what this test runs. They run in order, each through bash,
in an empty working directory with a fresh ROOST_HOME, as a user who just installed would:
the main job, the repeat from its run.yaml (into the sibling runs/train-2), `swarm eval`,
`swarm inspect`, a first research study and the commands that show it.

Two things differ from a user's run, both said here and nowhere else:

* SHORTER: a few commands get flags appended (the last value of an option wins), only to
  fit the test into ~3 minutes on 2 cores: 300 steps of the main job take 2 minutes and the
  README's study 5. Everything else on their command line is the README's.
* SKIPPED: the lines that install (pip, venv) are left out, since the test runs in the installed
  checkout, and the LLM planner's block, which needs an endpoint (tests/researcher cover it
  with a scripted model). Any other command line in RUN_SECTIONS must be run: a new
  one fails `test_every_readme_command_is_run_or_skipped_with_a_reason` until it is.

The embedded model is not built again: the one in ROOST_HOME (or ~/.cache/roost) is linked
into the fresh ROOST_HOME, so `swarm model init` finds it complete, as it does on a second
run. Where none is built and ROOST_HOME is set (CI), the test builds it there first, under
the build's lock: tests/test_model_build.py's default-recipe test builds the same directory,
so the suite pays for one build of ~2 minutes, not two (whichever test comes second waits for
the first's and checks it). Only without ROOST_HOME does `swarm model init` build it here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RUN_SECTIONS = ("The two commands", "Research studies")

SHORTER = {  # README command prefix -> flags appended, and why
    "swarm train --task arith": ("--steps 3 --no-mlflow", "300 steps take 2 min; MLflow's model logging 10 s"),
    "swarm eval ": ("--n 8", "200 episodes per model and temperature"),
    "researcher study ": (
        "--steps 2 --poll 1",
        "6 trials of 20 steps take 5 min; 2 steps still run the whole "
        "study; --poll 1 looks at the trials every second, not every 5",
    ),
}
SKIPPED = {  # command prefix -> why the test does not run it
    "python3 -m venv": "installs: the test runs in the installed checkout",
    ". .venv/bin/activate": "installs: the test runs in the installed checkout",
    "pip install": "installs: the test runs in the installed checkout",
    "bash .ci/run": "the CI itself (the test suite this test belongs to)",
}
NEEDS_ENDPOINT = "ROOST_LLM_BASE_URL"  # a block that sets it plans with an LLM: skipped whole


@dataclass
class Command:
    text: str  # as the README writes it (a `&&` chain split into its commands)
    section: str
    skip: str | None = None  # the reason it is not run

    @property
    def argv_text(self) -> str:
        """What runs: the README's command, with SHORTER's flags appended where it says so."""
        for prefix, (flags, _) in SHORTER.items():
            if self.text.startswith(prefix):
                code = re.split(r"\s+#(?=\s|$)", self.text, maxsplit=1)[0]  # flags go before a trailing comment
                return f"{code} {flags}"
        return self.text


def _sections() -> dict[str, str]:
    parts = re.split(r"^## ", README.read_text(), flags=re.M)
    return {p.split("\n", 1)[0].strip(): p for p in parts[1:]}


def readme_commands() -> list[Command]:
    """Every command line of RUN_SECTIONS' fenced bash blocks, in order, each run or skipped with a reason."""
    sections = _sections()
    out: list[Command] = []
    for title in RUN_SECTIONS:
        assert title in sections, f"README.md has no section '## {title}'"
        for block in re.findall(r"```bash\n(.*?)```", sections[title], re.S):
            block_skip = "plans with an LLM: needs an endpoint" if NEEDS_ENDPOINT in block else None
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                for part in (p.strip() for p in line.split("&&")):
                    skip = block_skip or next((why for pre, why in SKIPPED.items() if part.startswith(pre)), None)
                    out.append(Command(part, title, skip))
    return out


def _built_model() -> Path | None:
    """The embedded model as `swarm model init` left it, in this environment's ROOST_HOME or the default one."""
    from store.paths import default_model_dir  # lazy: reads ROOST_HOME when asked
    from swarm.model.build import is_complete  # lazy: a build imports torch

    for candidate in (default_model_dir(), Path.home() / ".cache" / "roost" / "models" / "tiny-qwen2"):
        if is_complete(candidate, seed=0):
            return candidate.resolve()
    if os.environ.get("ROOST_HOME"):  # CI: build it once for this test and the default-recipe test
        from swarm.model.build import init_model  # lazy: a build imports torch

        return init_model(default_model_dir(), seed=0).resolve()  # waits if that test is building it
    return None


# ---------------------------------------------------------------- fast: what the README holds


def test_every_readme_command_is_run_or_skipped_with_a_reason() -> None:
    commands = readme_commands()
    run = [c.text for c in commands if c.skip is None]
    unknown = [c for c in run if not c.startswith(("swarm ", "researcher "))]
    assert not unknown, f"README commands this test does not know how to run: {unknown}"
    expected = {  # what the README documents, each at least once
        "the main job": r"^swarm train --task arith\b",
        "the repeat from run.yaml": r"^swarm train --config runs/train/run\.yaml\b",
        "swarm eval of the run": r"^swarm eval runs/train\b",
        "swarm inspect of the run": r"^swarm inspect runs/train\b",
        "a first research study": r'^researcher study "[^"]+"',
    }
    missing = [what for what, pattern in expected.items() if not any(re.search(pattern, c) for c in run)]
    assert not missing, f"README.md no longer shows {missing}; commands run: {run}"
    unused = [prefix for prefix in SHORTER if not any(c.startswith(prefix) for c in run)]
    assert not unused, f"SHORTER names commands the README no longer has: {unused}"
    study = next(c for c in run if c.startswith("researcher study "))
    assert "--planner" not in study and "--trial-program" not in study, "the first study is the rules planner's"
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", _sections()["Research studies"], re.M | re.S)
    printed = [body for lang, body in blocks if not lang]  # the output the README says the study prints
    assert printed and "Study 1 (planner: rules; local backend): " in printed[0], printed
    assert "Study 1 completed; report: ~/.cache/roost/studies/study-1/report/report.md" in printed[0], printed
    assert "HTML report: studies/study-1/report.html (open it with: researcher report 1 --open)" in printed[0]


def test_the_readme_says_where_a_repeat_goes_and_what_it_prints() -> None:
    """The repeat's message and folder, as "The run folder" states them, are what the slow test checks."""
    text = _sections()["The run folder"]
    assert "`repeating the run of OUT into OUT-2`" in text
    assert "`swarm train --config OUT/run.yaml`" in text


# ---------------------------------------------------------------- slow: run them


def _run(command: Command, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    r = subprocess.run(
        ["bash", "-c", command.argv_text], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    print(f"{time.monotonic() - t0:6.1f}s rc={r.returncode}: {command.argv_text}")  # shown with -s or on failure
    assert r.returncode == 0, f"`{command.argv_text}` ({command.section}): exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _timeout(text: str, built: bool) -> float:
    """A hang guard per command, not a speed check: the study runs six `swarm train` trials, each a server's
    start-up (~25 CPU-s with MLflow), which took 230-240 s of a two-core CI host busy with two other workers."""
    if text.startswith("researcher study "):
        return 480
    return 300 if text.startswith("swarm model init") and not built else 240


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_commands_run_as_written(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "work"
    cwd.mkdir()
    model = _built_model()
    if model is not None:  # `swarm model init` finds it complete and keeps it
        (home / "models").mkdir(parents=True)
        (home / "models" / "tiny-qwen2").symlink_to(model, target_is_directory=True)
    bin_dir = str(Path(sys.executable).parent)  # the installed `swarm` and `researcher` scripts
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("ROOST_LLM_", "OPENAI_", "MLFLOW_TRACKING_URI", "ROOST_DATABASE_URL", "ROOST_TRIAL_PROGRAM", "PYTHONPATH")
        )
    }
    env.update(
        ROOST_HOME=str(home),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        COLUMNS="200",
        MLFLOW_DISABLE_TELEMETRY="true",
    )

    commands = [c for c in readme_commands() if c.skip is None]
    first_summary: dict = {}  # the main job's, which its repeat must leave as it was
    t_start = time.monotonic()
    for command in commands:
        text = command.text
        r = _run(command, cwd, env, timeout=_timeout(text, built=model is not None))
        out = r.stdout + r.stderr
        if text.startswith("swarm model init"):
            assert (home / "models" / "tiny-qwen2" / "config.json").exists(), out
        elif text.startswith("swarm train --task"):
            summary = first_summary = _summary(cwd / "runs" / "train")
            assert summary["status"] == "finished" and summary["steps_done"] == 3, summary
            assert (cwd / "runs" / "train" / "run.yaml").exists()
        elif text.startswith("swarm train --config runs/train/run.yaml"):
            # "The run folder": it repeats into the first free sibling, OUT-2, and says so
            assert re.search(r"repeating the run of (\S*/)?runs/train into (\S*/)?runs/train-2\b", out), out
            repeat, first = _summary(cwd / "runs" / "train-2"), _summary(cwd / "runs" / "train")
            assert repeat["status"] == "finished" and repeat["steps_done"] == 3, repeat
            assert repeat["config"] == first["config"]  # the same settings
            assert first == first_summary  # the first run untouched
            recorded, again = (
                yaml.safe_load((cwd / "runs" / d / "run.yaml").read_text()) for d in ("train", "train-2")
            )
            orchestrated = {"port", "out_dir"}  # what the repeat picks afresh: a free port, its own folder
            assert {k: v for k, v in again["server"].items() if k not in orchestrated} == {
                k: v for k, v in recorded["server"].items() if k not in orchestrated
            }
            assert {k: v for k, v in again.items() if k not in ("out", "server", "ran")} == {
                k: v for k, v in recorded.items() if k not in ("out", "server", "ran")
            }
        elif text.startswith("swarm eval"):
            # a run folder: the last checkpoint beside the model the run started from
            assert "initial" in out and "trained" in out and "arith" in out, out
            assert "guess" not in out, out  # the run's own task, not every one
        elif text.startswith("swarm inspect"):
            assert "logprob" in out and "mask" in out, out
        elif text.startswith("researcher study "):
            report = home / "studies" / "study-1" / "report" / "report.md"
            assert f"Study 1 (planner: rules; local backend): {home / 'studies' / 'study-1'}" in out, out
            assert f"Study 1 completed; report: {report}" in out, out
            assert report.read_text().startswith("# Study 1"), report.read_text()[:200]
            assert "HTML report: studies/study-1/report.html" in out, out  # under the working directory
            assert (cwd / "studies" / "study-1" / "report.html").read_text().startswith("<!DOCTYPE html>")
            trials = sorted((home / "studies" / "study-1" / "trials").glob("t*/out/summary.json"))
            assert len(trials) == 6, trials  # 2 arms x 3 seeds
            assert all(_summary(t.parent)["steps_done"] == 2 for t in trials)
        elif text.startswith("researcher status 1"):
            assert "COMPLETED" in out, out
        elif text.startswith("researcher report 1"):
            assert r.stdout.startswith("# Study 1"), r.stdout[:200]
        else:
            raise AssertionError(f"no check for the README command `{text}`: add one here")
    print(f"{time.monotonic() - t_start:6.1f}s in all")
