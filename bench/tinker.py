"""The Tinker API's cost: forward_backward + optim_step through HTTP against the same compute called
directly, side by side in one run.

    python bench/tinker.py                          # embedded model if built, else the tiny one
    python bench/tinker.py --model DIR --steps 20 --batch 64 --tokens 64 --json out.json

HTTP: a `swarm serve` process (torch engine, one LoRA policy) on loopback; this process sends what
the tinker SDK sends (the protobuf forward_backward body, the JSON optim_step, `retrieve_future`
polls, protobuf results asked for) with httpx, and times one step from the first byte sent to the
optim_step's result. Direct: the same primitives (`swarm.tinker.compute`) on a LoRA policy of a
host in this process, on the same batch. The two alternate step by step, so a noisy machine slows
both alike; the overhead is the ratio of medians. The server process and this one never compute at
the same time (every step waits for its result), so neither takes the other's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from store.ports import free_port
from swarm.tinker.wire import WireDatum, encode_forward_backward

TOKEN = "bench-token"
PROTO = "application/x-protobuf"


def _model_dir(given: str | None, work: Path) -> Path:
    if given:
        return Path(given)
    from store.paths import default_model_dir

    embedded = default_model_dir()
    if (embedded / "config.json").exists():
        return embedded
    from swarm.testing import tiny_model_dir

    return tiny_model_dir(work)


def _serve(model: Path, out: Path, rank: int, device: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "swarm", "serve", "--engine", "torch", "--device", device, "--model", str(model)]
    cmd += ["--port", str(port), "--token", TOKEN, "--admin-token", "bench-admin", "--lora-rank", str(rank)]
    cmd += ["--policy", "main", "--out", str(out), "--no-mlflow"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 180
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit("swarm serve exited before it served")
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("swarm serve did not start")


class HttpLoop:
    """What the SDK does for one forward_backward + optim_step, over one keep-alive connection."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"X-API-Key": f"tml-{TOKEN}"}, timeout=300)
        sid = self.http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "bench"}).json()["session_id"]
        body = {"session_id": sid, "model_seq_id": 0, "base_model": self.base(), "lora_config": {"rank": RANK}}
        rid = self.http.post("/api/v1/create_model", json=body).json()["request_id"]
        self.model_id = self.result(rid)["model_id"]
        self.seq = 0

    def base(self) -> str:
        return self.http.get("/api/v1/get_server_capabilities").json()["supported_models"][0]["model_name"]

    def result(self, rid: str, proto: bool = False) -> Any:
        headers = {"Accept": PROTO} if proto else {}
        while True:
            r = self.http.post("/api/v1/retrieve_future", json={"request_id": rid}, headers=headers)
            r.raise_for_status()
            if r.headers["content-type"].startswith(PROTO):
                return r.content
            out = r.json()
            if out.get("type") != "try_again":
                if "error" in out:
                    raise RuntimeError(out["error"])
                return out

    def step(self, data: list[WireDatum], lr: float) -> float:
        t0 = time.perf_counter()
        self.seq += 1
        body = encode_forward_backward(self.model_id, self.seq, "cross_entropy", data)
        rid = self.http.post("/api/v1/forward_backward", content=body, headers={"Content-Type": PROTO}).json()
        self.result(rid["request_id"], proto=True)
        self.seq += 1
        adam = {"learning_rate": lr, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12}
        rid = self.http.post(
            "/api/v1/optim_step", json={"model_id": self.model_id, "seq_id": self.seq, "adam_params": adam}
        )
        self.result(rid.json()["request_id"])
        return time.perf_counter() - t0


RANK = 8


def main() -> None:
    global RANK
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    RANK = args.rank
    work = Path(tempfile.mkdtemp(prefix="bench-tinker-"))
    model = _model_dir(args.model, work)

    from swarm.config.lora import LoraSettings  # lazy: torch, after the server process has started loading
    from swarm.engine.policies import PolicyHost
    from swarm.tinker.compute import AdamStep, Datum, GradStash, forward_backward, optim_step

    proc, url = _serve(model, work / "server", args.rank, args.device)
    try:
        host = PolicyHost(model, seed=0, device=args.device)
        policy = host.add("direct", LoraSettings(rank=args.rank, lr_scale=1.0))
        vocab = host.base.batcher.vocab_size
        rng = random.Random(0)
        seqs = [[rng.randrange(3, vocab) for _ in range(args.tokens + 1)] for _ in range(args.batch)]
        wire = [WireDatum(s[:-1], {"target_tokens": np.asarray(s[1:]), "weights": np.ones(args.tokens)}) for s in seqs]
        direct = [Datum(s[:-1], s[1:], {"weights": [1.0] * args.tokens}) for s in seqs]
        loop = HttpLoop(url)
        stash = GradStash()

        def direct_step() -> float:
            t0 = time.perf_counter()
            forward_backward(policy, direct, "cross_entropy", {}, stash)
            optim_step(policy, AdamStep(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-12), stash)
            return time.perf_counter() - t0

        loop.step(wire, 1e-4)  # warm both paths (first forward, allocator, connection)
        direct_step()
        http_s, direct_s = [], []
        for _ in range(args.steps):
            http_s.append(loop.step(wire, 1e-4))
            direct_s.append(direct_step())
        h, d = statistics.median(http_s), statistics.median(direct_s)
        overhead = h / d - 1
        print(f"model: {model} ({vocab}-token vocabulary), LoRA rank {args.rank}, device {args.device}")
        print(f"one forward_backward + optim_step of {args.batch} x {args.tokens} tokens, median of {args.steps}")
        print(f"{'path':>30} | {'median s':>9} | {'steps (s)'}")
        print(f"{'direct (swarm.tinker.compute)':>30} | {d:9.4f} | {' '.join(f'{x:.3f}' for x in direct_s)}")
        print(f"{'HTTP (swarm serve, SDK wire)':>30} | {h:9.4f} | {' '.join(f'{x:.3f}' for x in http_s)}")
        print(f"overhead of the Tinker API: {overhead * 100:+.1f} % (target <= 10 %)")
        if args.json:
            Path(args.json).write_text(
                json.dumps({"http_s": http_s, "direct_s": direct_s, "overhead": overhead, "batch": args.batch})
            )
        loop.http.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


if __name__ == "__main__":
    main()
