"""Parts of bench/scale.py: the memory bound, the peak-RSS child, `swarm train` under an RSS sampler.

Kept apart from scale.py so that the pure parts (`memory_bound`, `Shape.of`) can be tested without
torch (tests/unit/test_scale_bench.py) and so that the child a peak is measured in imports nothing
it does not need:

    python bench/_scale_parts.py memory MODEL_DIR --lora-rank 0 --micro-batch-tokens 512

prints one JSON line: the process's RSS at each stage, its VmHWM, the parameter counts and the bound.
A fresh process per measurement, because VmHWM never goes down: a peak measured after another part
ran would be that part's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: floats autograd keeps per token and decoder layer, in units of hidden (h), intermediate (i) and the
#: key/value width (kv = KV heads x head dim); derived in bench/scale.py's docstring
ACT_PER_H, ACT_PER_I, ACT_PER_KV = 12, 4, 3
#: floats per token outside the layers (embedding output, final norm) in units of h
ACT_OUTSIDE_H = 2
#: floats per *trained* token over the vocabulary: logits, their log-softmax, the gradient in backward
LOGIT_COPIES = 3


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, bytes (0 when it is gone)."""
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in out:
                out[key] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


@dataclass(frozen=True)
class Shape:
    """What the bound needs of a model: its parameter counts and the widths of a Qwen2-style decoder."""

    params: int
    trainable: int
    hidden: int
    intermediate: int
    layers: int
    kv: int
    vocab: int

    @classmethod
    def of(cls, config: dict, params: int, trainable: int) -> Shape:
        """From a Hugging Face config dict (`config.to_dict()` or config.json)."""
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        return cls(
            params=params,
            trainable=trainable,
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            kv=kv_heads * head_dim,
            vocab=config["vocab_size"],
        )


def memory_bound(shape: Shape, tokens: int, trained: int, bytes_per: int = 4) -> dict[str, int]:
    """The analytic bound of one training step's memory, bytes, by part (bench/scale.py has the formula)."""
    per_token = shape.layers * (ACT_PER_H * shape.hidden + ACT_PER_I * shape.intermediate + ACT_PER_KV * shape.kv)
    per_token += ACT_OUTSIDE_H * shape.hidden
    parts = {
        "weights": shape.params * bytes_per,
        "grads": shape.trainable * bytes_per,
        "adamw": 2 * shape.trainable * bytes_per,
        "activations": tokens * per_token * bytes_per + trained * LOGIT_COPIES * shape.vocab * bytes_per,
    }
    parts["total"] = sum(parts.values())
    return parts


def memory_samples(vocab: int, tokens: int, seed: int = 0) -> tuple[list, int]:
    """Samples that fill one micro-batch of `tokens` exactly, no two alike (so the shared-prefix forward
    does not shrink it), a quarter of each row prompt; the number of trained positions."""
    from swarm.samples import TrainSample

    rng = random.Random(seed)
    length = min(64, tokens)
    rows = max(1, tokens // length)
    prompt = length // 4
    samples = [
        TrainSample(
            input_ids=[rng.randrange(vocab) for _ in range(length)],
            loss_mask=[0] * prompt + [1] * (length - prompt),
            rollout_logprobs=[0.0] * prompt + [-1.0] * (length - prompt),
            episode_id=f"m{i}",
            group_id=f"g{i // 2}",  # pairs with rewards 0 and 1: every advantage non-zero
            reward=float(i % 2),
        )
        for i in range(rows)
    ]
    return samples, rows * (length - prompt)  # position t is trained when token t + 1 is


def memory_child(model_dir: Path, rank: int, micro_batch_tokens: int, steps: int) -> dict:
    """One engine as `swarm serve` builds it (swarm/server/app.py: KL reference included), `steps` steps on
    one full micro-batch; RSS after the imports, the load and each step, and the high-water mark."""
    import torch  # noqa: F401  (lazy: the runtime's own RSS is part of the baseline)

    from swarm.config.lora import LoraSettings
    from swarm.config.train import TrainConfig
    from swarm.engine.base import TrainBatch
    from swarm.engine.torch_engine import TorchEngine

    out: dict = {"runtime": proc_status()["VmRSS"]}
    engine = TorchEngine(model_dir, lora=LoraSettings(rank=rank))
    out["loaded"] = proc_status()["VmRSS"]
    config = engine.network.config
    samples, trained = memory_samples(int(config.vocab_size), micro_batch_tokens)
    batch = TrainBatch(samples, TrainConfig(lr=1e-5, micro_batch_tokens=micro_batch_tokens))
    t0 = time.perf_counter()
    for i in range(steps):
        engine.train_step(batch)
        out[f"after_step_{i + 1}"] = proc_status()["VmRSS"]
    out["step_s"] = (time.perf_counter() - t0) / steps
    out["peak"] = proc_status()["VmHWM"]
    params = list(engine.model.parameters())
    shape = Shape.of(
        config.to_dict(), sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
    )
    ref = engine._reference  # held now: the engine loads it only when a step sets kl_coef
    out["reference"] = 0 if ref is None or ref is engine.model else sum(p.numel() * 4 for p in ref.parameters())
    out["shape"] = asdict(shape)
    out["tokens"] = sum(len(s.input_ids) for s in samples)
    out["bound"] = memory_bound(shape, out["tokens"], trained)
    out["ratio"] = round((out["peak"] - out["runtime"]) / out["bound"]["total"], 3)
    engine.batcher.close()
    return out


def measure_memory(model_dir: Path, rank: int, micro_batch_tokens: int, steps: int = 2) -> dict:
    """`memory_child` in a fresh interpreter (its own VmHWM), with the child's load and step time."""
    cmd = [sys.executable, __file__, "memory", str(model_dir), "--lora-rank", str(rank)]
    cmd += ["--micro-batch-tokens", str(micro_batch_tokens), "--steps", str(steps)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"memory child exited {done.returncode}: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["mode"] = f"lora r{rank}" if rank else "full"
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def _tree(root: int) -> list[int]:
    """`root` and every descendant alive now (from /proc/*/stat's parent ids)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, ()))
    return out


class TreeRss:
    """Samples the summed RSS of a process tree every `period` s: `swarm train` is a server, its client
    fleet and (vllm) a vLLM server, and getrusage's children maximum is the largest one alone."""

    def __init__(self, root: int, period: float = 0.25) -> None:
        self.root, self.period = root, period
        self.peak_sum = 0
        self.peak_one: dict[int, int] = {}  # pid -> its VmHWM, last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            total = 0
            for pid in _tree(self.root):
                st = proc_status(pid)
                total += st["VmRSS"]
                if st["VmHWM"]:
                    self.peak_one[pid] = st["VmHWM"]
            self.peak_sum = max(self.peak_sum, total)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def swarm_train(engine: str, model_dir: Path, out: Path, steps: int = 2, timeout: float = 900) -> dict:
    """`swarm train --engine ENGINE --model DIR --steps N` with small groups: wall time, peak RSS of its tree."""
    cmd = [sys.executable, "-m", "swarm", "train", "--engine", engine, "--model", str(model_dir)]
    cmd += ["--steps", str(steps), "--group-size", "2", "--batch-groups", "2", "--concurrency", "4"]
    cmd += ["--out", str(out), "--fresh", "--no-mlflow", "--no-checkpoint-on-stop", "--timeout", str(timeout)]
    if engine == "vllm":
        cmd += ["--vllm-max-model-len", "1024"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    sampler = TreeRss(proc.pid)
    try:
        log, _ = proc.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
    finally:
        sampler.stop()
    summary = out / "summary.json"
    status = json.loads(summary.read_text()).get("status") if summary.exists() else None
    return {
        "engine": engine,
        "rc": proc.returncode,
        "status": status,
        "completed": proc.returncode == 0 and status != "failed",
        "wall_s": round(time.perf_counter() - t0, 1),
        "peak_rss_sum": sampler.peak_sum,
        "peak_rss_largest": max(sampler.peak_one.values(), default=0),
        "log_tail": "" if proc.returncode == 0 else log[-1500:],
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the peak-RSS child of bench/scale.py")
    ap.add_argument("what", choices=["memory"])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--micro-batch-tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(memory_child(a.model_dir, a.lora_rank, a.micro_batch_tokens, a.steps)))
