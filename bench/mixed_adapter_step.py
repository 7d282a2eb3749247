"""Several LoRA policies' training forwards as one batch of mixed rows, against one forward each.

    python bench/mixed_adapter_step.py                          # embedded model, 6 policies x 32 rows
    python bench/mixed_adapter_step.py --hidden 896 --layers 24 --device cuda --dtype bfloat16

Why: one server of k policies runs their steps one after the other (docs/policies.md), so k policies
cost k steps. If the k steps' forwards and backward ran as one batch, each row through its own
adapter (peft's per-row `adapter_names`, which swarm/engine/adapter_routing.py already routes for
mixed generation batches), the base's matmuls would run once for all of them. This measures whether
that pays before anything is built on it: the same rows, the same loss (each policy's own token
mean, summed), once as k routed forward/backwards and once as one forward/backward over every row,
alternated `--repeats` times; the ratio of medians, and the largest gradient difference between
the two (the two must train the same).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _models import embedded_or_untrained  # bench/ is not a package: the script's folder is on the path
from transformers import AutoModelForCausalLM

from swarm.config.lora import LoraSettings
from swarm.engine import adapter_routing, lora


def _model(args: argparse.Namespace, tmp: Path) -> Path:
    if args.hidden:
        from sync_lora import build_model  # bench/ is not a package: the script's folder is on the path

        return build_model(tmp / "model", args.hidden, args.layers)[0]
    return embedded_or_untrained(tmp)


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -lp.mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", type=int, default=6)
    ap.add_argument("--rows", type=int, default=32, help="rows per policy")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per row")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=0, help="a random Qwen2 of this width (0: the embedded model)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        base = _model(args, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, args.dtype)).to(args.device)
        params = sum(p.numel() for p in model.parameters())  # the base's, before peft adds adapters
        settings = LoraSettings(rank=8)
        names = [f"p{i}" for i in range(args.policies)]
        peft_model = lora.attach(model, settings, base, names[0])
        for name in names[1:]:
            lora.add_adapter(peft_model, name, settings, base)
        adapter_routing.install(peft_model)
        adapter_routing.train_every_adapter(peft_model)
        for pname, p in peft_model.named_parameters():  # B = 0 would give every adapter the same gradient path
            if "lora_B" in pname:
                torch.nn.init.normal_(p, std=0.01)
    k, rows = args.policies, args.rows
    ids = torch.randint(0, model.config.vocab_size, (k, rows, args.tokens), device=args.device)
    mixed_rows = [name for name in names for _ in range(rows)]

    def separate() -> None:
        for i, name in enumerate(names):
            with adapter_routing.route(name):
                _loss(peft_model(input_ids=ids[i]).logits, ids[i]).backward()

    def mixed() -> None:
        with adapter_routing.route(rows=mixed_rows):
            logits = peft_model(input_ids=ids.reshape(k * rows, -1)).logits
        sum(_loss(logits[i * rows : (i + 1) * rows], ids[i]) for i in range(k)).backward()

    def timed(fn) -> tuple[float, dict[str, torch.Tensor]]:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        grads = {n: p.grad.detach().clone() for n, p in peft_model.named_parameters() if p.grad is not None}
        peft_model.zero_grad(set_to_none=True)
        return dt, grads

    _, g_sep = timed(separate)  # warm-up, and the parity check
    _, g_mix = timed(mixed)
    diff = max((g_sep[n].float() - g_mix[n].float()).abs().max().item() for n in g_sep)
    t_sep, t_mix = [], []
    for _ in range(args.repeats):
        t_sep.append(timed(separate)[0])
        t_mix.append(timed(mixed)[0])
    s, m = statistics.median(t_sep), statistics.median(t_mix)
    print(
        f"{params / 1e6:.1f}M parameters ({args.dtype}, {args.device}), {k} policies x {rows} rows x "
        f"{args.tokens} tokens, LoRA rank 8 on every linear layer; median of {args.repeats}"
    )
    print(f"separate ({k} routed forward/backwards): {s:.4f} s   {' '.join(f'{x:.3f}' for x in t_sep)}")
    print(f"mixed (one forward/backward, per-row):   {m:.4f} s   {' '.join(f'{x:.3f}' for x in t_mix)}")
    print(f"mixed / separate: {m / s:.2f}   largest gradient difference: {diff:.2e} ({len(g_sep)} tensors)")


if __name__ == "__main__":
    main()
