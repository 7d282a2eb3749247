"""The stdlib-only helpers of the cookbook tests: the embedded model, Roost's `arith` problems, the
figures' report; the full install's python, a free port and `swarm serve`'s health from
tests/kit/full_install.py. Imported by name (conftest.py and the test
module put this folder on sys.path), never by the main suite's conftest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kit"))  # full_install.py, by name

from full_install import ROOT, full_python  # noqa: E402

TOKEN = "cookbook-worker-token"


def embedded_model() -> str:
    """The warm-started embedded model (`swarm model init`; built there if missing, ~4 min).

    `ROOST_COOKBOOK_MODEL` names another directory. The RL test needs the warm start: from random
    weights `arith` never earns a reward.
    """
    given = os.environ.get("ROOST_COOKBOOK_MODEL")
    if given:
        return given
    code = "from swarm.model.build import init_model; print(init_model())"
    r = subprocess.run([full_python(), "-c", code], capture_output=True, text=True, timeout=900, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"swarm model init failed:\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


def write_arith_problems(path: Path, seed: int, size: int) -> Path:
    """Roost's own `arith` problems (`swarm.tasks.arith.dataset`) as JSONL rows {question, answer}."""
    code = (
        "import json, sys; from swarm.tasks.arith import dataset\n"
        "rows = dataset(int(sys.argv[2]), int(sys.argv[3]))\n"
        "open(sys.argv[1], 'w').write(''.join(json.dumps({'question': r['question'], 'answer': r['answer']})"
        " + '\\n' for r in rows))"
    )
    subprocess.run([full_python(), "-c", code, str(path), str(seed), str(size)], check=True, timeout=120, cwd=ROOT)
    return path


@dataclass
class Served:
    url: str
    model: str
    log: Path


def report(name: str, figures: dict) -> None:
    """One line of the measured figures, to stdout (pytest -s) and to ROOST_COOKBOOK_REPORT if set."""
    line = f"{name}: {json.dumps(figures)}"
    print(line)
    if os.environ.get("ROOST_COOKBOOK_REPORT"):
        with open(os.environ["ROOST_COOKBOOK_REPORT"], "a") as f:
            f.write(line + "\n")
