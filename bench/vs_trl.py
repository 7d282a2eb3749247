"""Roost's `swarm train` against TRL's `GRPOTrainer`, side by side, same model, same task, same wall time.

    pip install -e '.[bench]'                       # TRL is a bench extra, not a core dependency
    python bench/vs_trl.py                          # 600 s each, at the same time, one core each
    python bench/vs_trl.py --seconds 300 --json runs/vs_trl.json

Both systems train the embedded model (built if missing) on the built-in `arith`
task with matched settings: 8 prompts x 8 samples a step, lr 1e-4 (constant),
temperature 1, at most 8 new tokens, PPO clip 0.2, no KL, token-mean loss
aggregation (TRL's `dapo` loss), group-normalised advantages (TRL's
`scale_rewards="group"`, Roost's GRPO), one optimiser step per generation batch.
They run at the same time, each pinned to its own core (`taskset`, one torch
thread), for the same wall time from launch (start-up counts for both). It prints
steps/min, the reward curve per time bin, when each system's moving average
(5 steps) first reaches fixed reward levels and the ratio of those times
(Roost / TRL: below 1 means Roost got there first), and held-out sampled accuracy
(temperature 1, 200 problems of a seed neither trains on) before and after.

    python bench/vs_trl.py --task calc --seconds 300  # agents with tools: multi-turn, TRL's `tools=`

`--task calc` (bench/_vs_trl_calc.py) runs the same comparison on the `calc` tool-use task: Roost runs
calc's workflow (an episode per sample, up to 3 calls), TRL its in-process tool loop (`tools=`), with
the same prompt, tool, reward, turns and tokens per turn; held-out accuracy is the exact answer's share
beside the mean reward.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _vs_trl_calc as calc_bench  # noqa: E402  (bench/ is not a package)

console = Console()
LEVELS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
MATCHED = {
    "prompts_per_step": 8,
    "group_size": 8,
    "lr": 1e-4,
    "temperature": 1.0,
    "max_tokens": 8,
    "clip_eps": 0.2,
    "kl_coef": 0.0,
    "loss_agg": "token-mean (TRL: dapo)",
    "advantage": "grpo, group std (TRL: scale_rewards=group)",
    "updates_per_batch": 1,
}
GROUP_CALL = (
    "generation: Roost samples through its server's continuous-batching torch engine over HTTP, "
    "one episode per group whose one OpenAI-client call asks for n = group size (a reward per "
    "choice, `swarm train --group-call`); TRL calls model.generate on the whole batch in-process"
)
ONE_CALL_PER_SAMPLE = (
    "generation: Roost samples through its server's continuous-batching torch engine over HTTP "
    "(an episode and an OpenAI-client call per sample); TRL calls model.generate on the whole "
    "batch in-process"
)
DIFFERENT = [
    GROUP_CALL,
    "AdamW betas: Roost (0.9, 0.99); TRL/transformers default (0.9, 0.999)",
    "gradient clipping: both 1.0; Roost clips the whole step, TRL per optimiser step (the same here)",
    "Roost streams episodes from a client process and trains a step as soon as 8 groups are complete, and "
    "the next step's episodes are claimed while it trains (their calls wait for the new weights: still "
    "on-policy); TRL generates then trains in one loop",
    "Roost's training forward computes each group's shared prompt once (the same gradient up to float "
    "rounding); TRL's computes every completion's prompt",
    "TRL's bf16 and gradient checkpointing (on by default in GRPOConfig) are turned off: fp32, no recomputation, "
    "its fastest settings on a CPU",
]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


# ---------------------------------------------------------------- the TRL side (a subprocess)


def trl_settings(out: Path, task: str = "arith") -> dict:
    """TRL's `GRPOConfig` arguments: the matched settings (calc's turn limits on top)."""
    matched = calc_bench.MATCHED if task == "calc" else MATCHED
    settings = dict(
        output_dir=str(out),
        per_device_train_batch_size=matched["prompts_per_step"] * matched["group_size"],
        num_generations=matched["group_size"],
        max_completion_length=matched["max_tokens"],
        temperature=matched["temperature"],
        learning_rate=matched["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        epsilon=matched["clip_eps"],
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        steps_per_generation=1,
        max_steps=1_000_000,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        max_grad_norm=1.0,
        weight_decay=0.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        # TRL 1.16 defaults both to True; on a CPU they make a 1M-parameter model several times slower
        # (bf16 autocast has no fast CPU kernels at this size, checkpointing recomputes every layer).
        # TRL's best CPU settings, so the comparison is against TRL at its fastest.
        bf16=False,
        gradient_checkpointing=False,
    )
    if task == "calc":
        settings.update(calc_bench.config_kwargs())
    return settings


def trl_worker(model: Path, out: Path, seconds: float, t0: float | None = None, task: str = "arith") -> None:
    """TRL's run; its clock is the driver's launch time `t0`, as Roost's is (imports, model
    loading and start-up count for both). `task` calc: calc's tool, reward and turn limits
    (bench/_vs_trl_calc.py) on top of the same settings."""
    import torch  # lazy: the TRL side runs in its own process
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from swarm.tasks import arith

    torch.set_num_threads(1)
    started = t0 if t0 is not None else time.time()
    if task == "calc":
        data, reward = Dataset.from_list(calc_bench.dataset_rows()), calc_bench.reward
    else:
        rows = arith.dataset(0, 20_000)
        data = Dataset.from_list(
            [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in rows]
        )

        def reward(completions: list, answer: list, **_: object) -> list[float]:
            return [arith.reward(c[0]["content"], a) for c, a in zip(completions, answer)]

    curve: list[dict] = []

    class Clock(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001 - transformers' signature
            if logs and "reward" in logs:
                curve.append({"step": state.global_step, "time": time.time() - started, "reward": logs["reward"]})
                (out / "curve.json").write_text(json.dumps(curve))

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            if time.time() - started > seconds:
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(model)
    tools = {}
    if task == "calc":
        tokenizer = calc_bench.prepare_tokenizer(tokenizer)
        tools = {"tools": [calc_bench.MultiplyTool()]}
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=reward,
        args=GRPOConfig(**trl_settings(out, task)),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
        **tools,
    )
    trainer.train()
    trainer.save_model(str(out / "final"))
    tokenizer.save_pretrained(out / "final")


# ---------------------------------------------------------------- the driver


def _launch(argv: list[str], core: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, **ONE_THREAD}
    return subprocess.Popen(
        ["taskset", "-c", str(core), *argv],
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen, grace: float = 60.0) -> None:
    from swarm import children  # lazy, as every swarm import here

    children.stop(proc, grace)


def _roost_curve(metrics: Path, started: float) -> list[dict]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    return [
        {"step": r["step"], "time": r["time"] - started, "reward": r["reward_mean"]}
        for r in rows
        if "reward_mean" in r and "time" in r
    ]


def moving_average(curve: list[dict], window: int = 5) -> list[tuple[float, float]]:
    out = []
    for i in range(len(curve)):
        part = curve[max(0, i - window + 1) : i + 1]
        out.append((curve[i]["time"], sum(p["reward"] for p in part) / len(part)))
    return out


def first_reach(curve: list[dict], level: float) -> float | None:
    """Seconds from launch until the 5-step moving average first reaches `level` (None: never)."""
    return next((round(t, 1) for t, avg in moving_average(curve) if avg >= level), None)


def per_bin(curve: list[dict], width: float, seconds: float) -> list[float | None]:
    bins: list[float | None] = []
    for k in range(int(seconds // width) + 1):
        inside = [p["reward"] for p in curve if k * width <= p["time"] < (k + 1) * width]
        bins.append(round(sum(inside) / len(inside), 3) if inside else None)
    return bins


def steps_per_min(curve: list[dict]) -> float:
    if len(curve) < 2:
        return 0.0
    return round(60 * (len(curve) - 1) / (curve[-1]["time"] - curve[0]["time"]), 1)


def held_out(model: Path, task: str = "arith") -> float | dict | None:
    if task == "calc":
        return calc_bench.held_out(model)
    from swarm.model.evaluate import evaluate  # lazy: torch, only after both runs ended

    if not (model / "config.json").exists():
        return None
    return evaluate(model, "arith", n=200, temperature=1.0, seed=424242)["mean_reward"]


def roost_argv(task: str, model: Path, out: Path, seconds: float, group_call: bool = True) -> list[str]:
    """`swarm train`'s arguments: the matched settings; arith's groups in one call unless not
    `group_call`, calc's an episode per sample."""
    matched = calc_bench.MATCHED if task == "calc" else MATCHED
    if task == "calc":
        fleet = calc_bench.roost_args()
    else:
        in_flight = matched["prompts_per_step"] * (1 if group_call else matched["group_size"])
        # said either way: arith's default is the group in one call
        fleet = ["--concurrency", str(in_flight), "--group-call" if group_call else "--no-group-call"]
    return [
        "train",
        "--task",
        task,
        "--model",
        str(model),
        "--out",
        str(out),
        "--fresh",
        "--steps",
        "1000000",
        "--group-size",
        str(matched["group_size"]),
        "--batch-groups",
        str(matched["prompts_per_step"]),
        "--lr",
        str(matched["lr"]),
        "--kl-coef",
        "0",
        "--clip-eps",
        str(matched["clip_eps"]),
        "--loss-agg",
        "token-mean",
        "--advantage",
        "grpo",
        "--no-mlflow",
        *fleet,
        "--timeout",
        str(seconds + 600),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=("arith", "calc"), default="arith", help="calc: multi-turn tool use")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--model", type=Path, default=None, help="default: the embedded model (built if missing)")
    ap.add_argument("--out", type=Path, default=None, help="default: runs/vs_trl (arith), runs/vs_trl_calc")
    ap.add_argument("--bin", type=float, default=60.0, help="seconds per reward bin")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--group-call",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Roost samples each group in one call (n = group size, a reward per choice), as TRL "
        "samples num_generations per prompt (arith's default); --no-group-call: one episode (one call) per "
        "sample. calc: always an episode per sample (each turn waits on the last one's tool result)",
    )
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_worker:
        trl_worker(args.model, args.out, args.seconds, args.t0, args.task)
        return
    if args.task == "calc" and args.group_call:
        ap.error("--group-call: calc's workflow makes several calls per episode; a group cannot be one call")
    calc = args.task == "calc"
    group_call = not calc and args.group_call is not False
    levels = calc_bench.LEVELS if calc else LEVELS
    from store.paths import default_model_dir

    model = args.model or default_model_dir()
    if not (model / "config.json").exists():
        from swarm.model.build import init_model  # lazy: torch

        init_model(model)
    out = (args.out or Path("runs/vs_trl_calc" if calc else "runs/vs_trl")).resolve()
    (out / "trl").mkdir(parents=True, exist_ok=True)
    roost_out = out / "roost"
    started = time.time()
    trl = _launch(
        [
            sys.executable,
            __file__,
            "--trl-worker",
            "--model",
            str(model),
            "--out",
            str(out / "trl"),
            "--seconds",
            str(args.seconds),
            "--t0",
            repr(started),
            "--task",
            args.task,
        ],
        0,
        out / "trl.log",
    )
    roost = _launch(
        [sys.executable, "-m", "swarm", *roost_argv(args.task, model, roost_out, args.seconds, group_call)],
        1,
        out / "roost.log",
    )
    try:
        while time.time() - started < args.seconds and (trl.poll() is None or roost.poll() is None):
            time.sleep(1.0)
    finally:
        _stop(roost)  # SIGTERM: swarm train stops its server, which writes a last checkpoint
        trl.wait(max(60.0, args.seconds * 0.2))  # TRL stops itself after its step in flight
        _stop(trl)
    curves = {
        "trl": json.loads((out / "trl" / "curve.json").read_text()) if (out / "trl" / "curve.json").exists() else [],
        "roost": _roost_curve(roost_out / "server" / "metrics.jsonl", started),
    }
    finals = {"trl": out / "trl" / "final", "roost": roost_out / "server" / "checkpoints" / "latest"}
    if calc:
        different = calc_bench.DIFFERENT
    else:
        different = DIFFERENT if group_call else [ONE_CALL_PER_SAMPLE, *DIFFERENT[1:]]
    matched = calc_bench.MATCHED if calc else MATCHED
    result = {"seconds": args.seconds, "matched": matched, "different": different, "systems": {}}
    if calc:
        result = {"task": "calc", **result, "levels": list(levels)}
    result["held_out_before"] = held_out(model, args.task)
    for name, curve in curves.items():
        result["systems"][name] = {
            "steps": len(curve),
            "steps_per_min": steps_per_min(curve),
            "first_step_s": round(curve[0]["time"], 1) if curve else None,  # launch to the first step's log
            "reward_bins": per_bin(curve, args.bin, args.seconds),
            "first_reach_s": {str(level): first_reach(curve, level) for level in levels},
            "held_out_after": held_out(finals[name].resolve(), args.task) if finals[name].exists() else None,
        }
    ratios = {}
    for level in levels:
        r, t = (result["systems"][s]["first_reach_s"][str(level)] for s in ("roost", "trl"))
        ratios[str(level)] = round(r / t, 2) if r is not None and t else None
    result["time_ratio_roost_over_trl"] = ratios
    _print(result, args.bin)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


def _print(result: dict, width: float) -> None:
    task = f" on {result['task']}" if "task" in result else ""
    table = Table(title=f"Roost vs TRL{task}, {result['seconds']:.0f} s each, one core each")
    table.add_column("measure")
    table.add_column("Roost", justify="right")
    table.add_column("TRL", justify="right")
    table.add_column("Roost/TRL", justify="right")
    r, t = result["systems"]["roost"], result["systems"]["trl"]
    table.add_row("steps", str(r["steps"]), str(t["steps"]), "")
    table.add_row("steps/min", str(r["steps_per_min"]), str(t["steps_per_min"]), "")
    table.add_row("first step logged at s", str(r["first_step_s"]), str(t["first_step_s"]), "")
    for level in result.get("levels", LEVELS):
        key = str(level)
        table.add_row(
            f"first MA5 >= {level}",
            str(r["first_reach_s"][key]),
            str(t["first_reach_s"][key]),
            str(result["time_ratio_roost_over_trl"][key]),
        )
    for k, (a, b) in enumerate(zip(r["reward_bins"], t["reward_bins"])):
        table.add_row(f"reward {k * width:.0f}-{(k + 1) * width:.0f} s", str(a), str(b), "")
    if result.get("task") == "calc":
        for key, what in (("accuracy", "accuracy (exact answer)"), ("mean_reward", "mean reward")):
            cells = [(h or {}).get(key) for h in (r["held_out_after"], t["held_out_after"], result["held_out_before"])]
            table.add_row(f"held-out sampled {what} after", str(cells[0]), str(cells[1]), "")
            table.add_row(f"held-out sampled {what} before", str(cells[2]), "", "")
    else:
        table.add_row("held-out sampled accuracy after", str(r["held_out_after"]), str(t["held_out_after"]), "")
        table.add_row("held-out sampled accuracy before", str(result["held_out_before"]), "", "")
    console.print(table)
    console.print("settings that differ:")
    for line in result["different"]:
        console.print(f"  - {line}")


if __name__ == "__main__":
    main()
