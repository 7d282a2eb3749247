"""A stand-in for `swarm train` in the researcher's tests: same flags, a summary.json in seconds.

Reward climbs with the learning rate (none at lr 0) plus seed noise, so a study
comparing lr 0 with lr 3e-4 has a clear answer. FAKE_TRIAL_SLEEP (seconds) makes
it run long enough to be killed mid-study; FAKE_TRIAL_STEP_SLEEP (seconds per step) makes it
report its steps one by one in out/server/metrics.jsonl first. Every start is appended to
<out>/../starts.log so a test can count submissions.
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--lr", type=float, default=1e-4)
ap.add_argument("--task", default="arith")
args, _ = ap.parse_known_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
with open(out.parent / "starts.log", "a") as f:
    f.write(f"{os.getpid()}\n")
time.sleep(float(os.environ.get("FAKE_TRIAL_SLEEP", "0")))
if os.environ.get("FAKE_TRIAL_FAIL_ARM") and str(args.lr) == os.environ["FAKE_TRIAL_FAIL_ARM"]:
    raise SystemExit(3)
if os.environ.get("FAKE_TRIAL_FAIL_ALL"):  # as a model folder without weights fails every trial
    sys.exit("OSError: no model.safetensors in the model folder")
rng = random.Random(args.seed * 7919 + int(args.lr * 1e6))
gain = min(1.0, args.lr / 3e-4) * 0.5
steps = [
    {"step": i, "reward_mean": 0.2 + gain * i / max(1, args.steps - 1) + rng.uniform(-0.03, 0.03)}
    for i in range(args.steps)
]
step_sleep = float(os.environ.get("FAKE_TRIAL_STEP_SLEEP", "0"))
if step_sleep:  # report each step while running, as `swarm train`'s server does (early stopping reads it)
    (out / "server").mkdir(exist_ok=True)
    for row in steps:
        with open(out / "server" / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        time.sleep(step_sleep)
summary = {
    "task": args.task,
    "steps": steps,
    "reward_first": steps[0]["reward_mean"],
    "reward_last": steps[-1]["reward_mean"],
    "wall_s": 0.1,
    "config": {"lr": args.lr, "seed": args.seed, "steps": args.steps},
}
if os.environ.get("FAKE_TRIAL_WORKFLOW_FAILS") == str(args.lr):  # as swarm train names a failing workflow
    summary["workflow_failures"] = [
        "client0.log: workflow failed (t3 attempt 1; the first of this kind, said once): KeyError: 'x' "
        f"(the traceback: {out / 'logs' / 'client0.log'})",
        "client0.log: workflow returned None without finishing the episode (t5): it is aborted, not trained",
    ]
(out / "summary.json").write_text(json.dumps(summary))
