"""One study, run twice side by side: its trials as separate `swarm train` runs, then as policies of one server.

    python bench/shared_base_study.py                      # 2 arms x 3 seeds, 20 steps each (~6 min on 2 cores)
    python bench/shared_base_study.py --steps 40 --json out.json

Why: `researcher study --shared-base` (researcher/shared_base.py) promises that a study's trials
cost less as LoRA policies of one server on one base than as a server each. This bench runs the
rules planner's lr study ("Compare 0 and 3e-4": arms lr=0 and lr=3e-4, three seeds each) through
the real graph, store, local scheduler and `swarm train`, on the embedded model (ROOST_HOME's
tiny-qwen2, or `--model`), first without `--shared-base` (each trial starts a server, trains,
logs to MLflow; `--parallel` trials at once, 2 by default as a study's default), then with it
(one server, every trial at once), and prints both wall times, their ratio (target <= 0.5) and
each study's verdict (the same expected). Both sides train LoRA adapters of rank 8 (like with like:
a `--lora-rank 8` common knob on the separate side), so what differs is only where they run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"


def run_study(home: Path, model: Path, steps: int, shared: bool, parallel: int) -> dict:
    """One study in its own ROOST_HOME, driven to its end here; its wall time and verdict."""
    os.environ["ROOST_HOME"] = str(home)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{home / 'mlflow.db'}"
    from sqlmodel import Session, select

    from researcher.config import SHARED_BASE_PARALLEL, StudyConfig
    from researcher.planning import PlanDefaults
    from researcher.runner import create_study, drive, make_context
    from store.db import dispose_engines
    from store.models import Hypothesis

    dispose_engines()  # the store follows ROOST_HOME
    cfg = StudyConfig(
        topic=TOPIC,
        shared_base=shared,
        # as `researcher study --shared-base` without --parallel: every trial of a round at once
        parallel=max(parallel, SHARED_BASE_PARALLEL) if shared else parallel,
        model_dir=str(model),
        defaults=PlanDefaults(steps=steps),
        poll_s=1.0,
        trial_program=[sys.executable, "-m", "swarm", "train", "--lora-rank", "8"],
    )
    t0 = time.monotonic()
    sid = create_study(cfg)
    step = drive(sid, poll_s=1.0)
    wall = time.monotonic() - t0
    ctx = make_context(sid)
    trials = ctx.trials()
    with Session(ctx.engine) as s:
        verdicts = [h.status for h in s.exec(select(Hypothesis).where(Hypothesis.study_id == sid)).all()]
    verdict = ", ".join(verdicts)
    return {
        "shared_base": shared,
        "wall_s": round(wall, 1),
        "trials": len(trials),
        "completed": sum(t.status == "COMPLETED" for t in trials),
        "verdict": verdict,
        "state": step.state,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    ap.add_argument("--steps", type=int, default=20, help="steps per trial")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once without --shared-base")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--keep", type=Path, default=None, help="keep both studies' homes here (default: a temp dir)")
    ap.add_argument("--only", choices=("separate", "shared"), default=None, help="run one side alone (to profile it)")
    args = ap.parse_args()
    from store.paths import default_model_dir
    from swarm.model.build import init_model

    model = args.model or init_model(default_model_dir())
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        for shared in (False, True):
            if args.only and args.only != ("shared" if shared else "separate"):
                continue
            r = run_study(Path(tmp) / ("shared" if shared else "separate"), model, args.steps, shared, args.parallel)
            results.append(r)
            print(json.dumps(r), flush=True)
    if args.only:
        return
    separate, shared = results
    ratio = shared["wall_s"] / separate["wall_s"]
    print(
        f"\n2 arms x 3 seeds, {args.steps} steps per trial, LoRA rank 8, model {model}\n"
        f"  separate servers (--parallel {args.parallel}): {separate['wall_s']:7.1f} s   "
        f"verdict {separate['verdict']}\n"
        f"  --shared-base (one server, all at once):  {shared['wall_s']:7.1f} s   verdict {shared['verdict']}\n"
        f"  wall time ratio shared / separate: {ratio:.2f} (target <= 0.5); same verdict: "
        f"{separate['verdict'] == shared['verdict']}"
    )
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
