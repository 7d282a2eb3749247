"""On-policy distillation vs GRPO, side by side on the embedded model (issue 24's acceptance).

    python bench/distill.py                          # ~10 min on 2 busy CPU cores
    python bench/distill.py --teacher-steps 150 --steps 40 --out /tmp/distill-bench

1. The teacher: `swarm train --task arith --steps T` (`--task calc`: multi-turn with a tool) from the
   embedded initial model (its last checkpoint is the teacher; `--reuse` keeps one already there).
2. Its temperature-1 reward: `swarm.model.evaluate` over `--eval-n` arith items at T=1 (and the
   initial model's, for scale).
3. Two students from the same embedded initial model, same seed, same steps and lr, run at the same
   time: GRPO alone (`swarm train --task arith`) and distillation alone (`--teacher OUT/teacher
   --distill-coef C --reward-coef 0`: the rewards are computed but not trained on), or with
   `--reward-coef R` distillation plus R x the GRPO advantage (the mix tinker-cookbook users run).
4. Their per-step training reward (the T=1 rollouts of the policy being trained: the same quantity
   the teacher's T=1 evaluation measures), smoothed over `--window` steps, and the first step at
   which each reaches the teacher's reward; the distillation run's `distill_kl` per step.
5. With `--eval-every K`: each student checkpoints every K steps, and every checkpoint is evaluated
   as the teacher was (`swarm.model.evaluate`, same items, T=1): the first checkpoint at or above the
   teacher's held-out reward, the measure that compares like with like (a run's training reward is on
   its own prompts, while the teacher's figure is held out).

Writes OUT/distill.json (the curves and the figures) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from store.paths import default_model_dir

ROOT = Path(__file__).resolve().parents[1]
SWARM = [sys.executable, "-m", "swarm"]


def train(out: Path, steps: int, lr: float, seed: int, *extra: str, task: str = "arith") -> subprocess.Popen:
    """`swarm train --task TASK` into `out` (its log beside it), started and not waited for."""
    out.parent.mkdir(parents=True, exist_ok=True)
    args = [*SWARM, "train", "--task", task, "--steps", str(steps), "--lr", str(lr), "--seed", str(seed)]
    args += ["--no-mlflow", "--fresh", "--out", str(out), *extra]
    log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed with the process by the OS
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ.copy())


def wait(proc: subprocess.Popen, what: str, log: Path) -> None:
    if proc.wait() != 0:
        tail = log.read_text().splitlines()[-15:]
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "server" / "metrics.jsonl").read_text().splitlines() if line]


def smoothed(values: list[float], window: int) -> list[float]:
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def first_reaching(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, v in enumerate(curve) if v >= target), None)


def t1_reward(model: Path, n: int, seed: int, task: str = "arith") -> float:
    from swarm.model.evaluate import evaluate, run_models  # lazy: torch, only after the runs

    path, _ = run_models(model)
    return float(evaluate(path, task, n=n, temperature=1.0, seed=seed)["mean_reward"])


def checkpoint_rewards(run: Path, n: int, seed: int, task: str) -> list[tuple[int, float]]:
    """(step, held-out T=1 reward) of each of a run's checkpoints, in step order."""
    steps = sorted((run / "server" / "checkpoints").glob("step_*"))
    return [(int(c.name.removeprefix("step_")), t1_reward(c, n, seed, task)) for c in steps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/roost-distill-bench"))
    ap.add_argument("--task", default="arith", help="the built-in task of the teacher and both students")
    ap.add_argument("--teacher-steps", type=int, default=150)
    ap.add_argument("--steps", type=int, default=40, help="steps of each student")
    ap.add_argument("--lr", type=float, default=3e-4, help="the teacher run's lr")
    ap.add_argument("--student-lr", type=float, default=None, help="both students' lr (default: --lr)")
    ap.add_argument("--grpo-lr", type=float, default=None, help="the GRPO student's lr (default: --student-lr)")
    ap.add_argument("--distill-lr", type=float, default=None, help="the distilled student's lr (default: --student-lr)")
    ap.add_argument("--distill-mode", choices=("sampled", "full"), default="sampled")
    ap.add_argument("--distill-coef", type=float, default=1.0)
    ap.add_argument(
        "--reward-coef",
        type=float,
        default=0.0,
        help="the distilled student's GRPO advantage scale (0: distillation alone, the issue's claim)",
    )
    ap.add_argument(
        "--grpo-extra", default="", help="more `swarm train` flags for the GRPO student, e.g. an lr schedule"
    )
    ap.add_argument(
        "--distill-extra",
        default="",
        help="more `swarm train` flags for the distilled student, e.g. '--lr-warmup-steps 10 --lr-decay-steps 150'",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--window", type=int, default=5, help="steps of the moving average")
    ap.add_argument("--reuse", action="store_true", help="keep a teacher already trained in OUT/teacher")
    ap.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="checkpoint the students every K steps and evaluate each checkpoint as the teacher (0: off)",
    )
    a = ap.parse_args()
    out: Path = a.out
    student_lr = a.lr if a.student_lr is None else a.student_lr
    grpo_lr = student_lr if a.grpo_lr is None else a.grpo_lr
    distill_lr = student_lr if a.distill_lr is None else a.distill_lr
    distilled = "distillation alone" if a.reward_coef == 0 else f"distillation + reward x{a.reward_coef:g}"
    started = time.monotonic()
    teacher = out / "teacher"
    if not (a.reuse and (teacher / "summary.json").is_file()):
        print(f"teacher: swarm train --task {a.task} --steps {a.teacher_steps} --lr {a.lr}", flush=True)
        proc = train(teacher, a.teacher_steps, a.lr, a.seed + 1, task=a.task)
        wait(proc, "the teacher run", teacher.with_suffix(".log"))
    teacher_s = time.monotonic() - started
    target = t1_reward(teacher, a.eval_n, a.seed, a.task)
    initial = t1_reward(default_model_dir(), a.eval_n, a.seed, a.task)
    print(f"T=1 reward over {a.eval_n} items: initial model {initial:.3f}, teacher {target:.3f}", flush=True)

    print(
        f"students: {a.steps} steps each, side by side: GRPO alone (lr {grpo_lr}) | {distilled} "
        f"(lr {distill_lr}, --distill-mode {a.distill_mode})",
        flush=True,
    )
    t0 = time.monotonic()
    every = ["--checkpoint-every", str(a.eval_every)] if a.eval_every > 0 else []
    runs = {
        "grpo": train(out / "grpo", a.steps, grpo_lr, a.seed, *every, *shlex.split(a.grpo_extra), task=a.task),
        "distill": train(
            out / "distill",
            a.steps,
            distill_lr,
            a.seed,
            *every,
            "--distill-mode",
            a.distill_mode,
            "--teacher",
            str(teacher),
            "--distill-coef",
            str(a.distill_coef),
            "--reward-coef",
            str(a.reward_coef),
            *shlex.split(a.distill_extra),
            task=a.task,
        ),
    }
    for name, proc in runs.items():
        wait(proc, f"the {name} run", (out / name).with_suffix(".log"))
    students_s = time.monotonic() - t0
    curves = {name: [r["reward_mean"] for r in rows(out / name)] for name in runs}
    kl = [r.get("distill_kl") for r in rows(out / "distill")]
    smooth = {name: smoothed(c, a.window) for name, c in curves.items()}
    reached = {name: first_reaching(c, target) for name, c in smooth.items()}

    print(f"\nstep  grpo reward (avg{a.window})  distill reward (avg{a.window})  distill_kl")
    for i in range(a.steps):
        print(
            f"{i + 1:4d}  {curves['grpo'][i]:.3f} ({smooth['grpo'][i]:.3f})      "
            f"{curves['distill'][i]:.3f} ({smooth['distill'][i]:.3f})          {kl[i]:+.4f}"
        )
    for name in runs:
        at = reached[name]
        print(f"{name}: reaches the teacher's T=1 reward {target:.3f} (avg{a.window}) at step {at or f'> {a.steps}'}")
    held_out = {name: checkpoint_rewards(out / name, a.eval_n, a.seed, a.task) for name in runs} if every else {}
    held_reached = {name: next((s for s, r in pts if r >= target), None) for name, pts in held_out.items()}
    if held_out:
        print(f"\nheld-out T=1 reward over {a.eval_n} items at each checkpoint (the teacher: {target:.3f})")
        print("step  " + "  ".join(f"{name:>8}" for name in held_out))
        for i, (step, _) in enumerate(held_out["grpo"]):
            print(f"{step:4d}  " + "  ".join(f"{pts[i][1]:8.3f}" for pts in held_out.values() if i < len(pts)))
        for name, at in held_reached.items():
            print(f"{name}: held-out reward reaches the teacher's {target:.3f} at checkpoint {at or f'> {a.steps}'}")
    result = {
        "task": a.task,
        "teacher_steps": a.teacher_steps,
        "steps": a.steps,
        "lr": a.lr,
        "grpo_lr": grpo_lr,
        "distill_lr": distill_lr,
        "distill_mode": a.distill_mode,
        "distill_coef": a.distill_coef,
        "reward_coef": a.reward_coef,
        "grpo_extra": a.grpo_extra,
        "distill_extra": a.distill_extra,
        "seed": a.seed,
        "window": a.window,
        "initial_t1_reward": initial,
        "teacher_t1_reward": target,
        "curves": curves,
        "smoothed": smooth,
        "distill_kl": kl,
        "reached_at": reached,
        "held_out": held_out,
        "held_out_reached_at": held_reached,
        "teacher_s": round(teacher_s, 1),
        "students_s": round(students_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out / "distill.json").write_text(json.dumps(result, indent=2))
    took = f"teacher {result['teacher_s']} s, students {result['students_s']} s"
    print(f"wall {result['wall_s']} s ({took}); {out / 'distill.json'}")


if __name__ == "__main__":
    main()
