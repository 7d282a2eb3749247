"""bench/scale.py's report as one table, models side by side, and its targets checked.

Pure (a report dict in, rows and verdicts out; rich only to print), so tests/unit/test_scale_bench.py
checks the assembly on a hand-made report without measuring anything.
"""

from __future__ import annotations

from rich.table import Table

MIB = 2**20
#: the targets of issue 28, on the 0.5B: (figure, bound, direction)
GEN_RATIO_MIN = 0.5  # torch / vLLM generation tokens/s at 32 concurrent
MEMORY_RATIO_MAX = 1.3  # train-step peak RSS over the analytic bound
FULL_SYNC_MAX_S = 3.0  # one full weight sync to vLLM
TARGET_MODEL = "0.5b"

Row = tuple[str, list[str], str]


def _gen(m: dict, engine: str, c: int) -> float | None:
    for r in m.get("generation", {}).get(engine) or []:
        if r["concurrency"] == c:
            return r["tokens_per_s"]
    return None


def _f(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def concurrencies(report: dict) -> list[int]:
    seen: set[int] = set()
    for m in report["models"].values():
        for rows in m.get("generation", {}).values():
            seen.update(r["concurrency"] for r in rows or [])
    return sorted(seen)


def table_rows(report: dict) -> list[Row]:
    """(figure, one cell per model in report order, target) for every figure any model has."""
    models = list(report["models"].values())
    rows: list[Row] = [("parameters", [_f(m.get("params"), "{:,}") for m in models], "")]

    def add(label: str, values: list[str], target: str = "") -> None:
        if any(v != "-" for v in values):
            rows.append((label, values, target))

    for c in concurrencies(report):
        add(f"generate tok/s, {c} concurrent: torch", [_f(_gen(m, "torch", c)) for m in models])
        add(f"generate tok/s, {c} concurrent: vLLM", [_f(_gen(m, "vllm", c)) for m in models])
        target = f">= {GEN_RATIO_MIN} (0.5B)" if c == 32 else ""
        ratios = [_f(_ratio(_gen(m, "torch", c), _gen(m, "vllm", c)), "{:.2f}") for m in models]
        add(f"  torch / vLLM at {c}", ratios, target)
    steps = [m.get("train_step") or {} for m in models]
    add("train_step: tokens in the step", [_f(s.get("tokens"), "{:,}") for s in steps])
    add("train_step tok/s: engine", [_f(s.get("engine_tokens_per_s")) for s in steps])
    add("train_step tok/s: engine, no shared prefix", [_f(s.get("plain_tokens_per_s")) for s in steps])
    add("train_step tok/s: raw torch step", [_f(s.get("raw_tokens_per_s")) for s in steps])
    add(
        "  engine / raw", [_f(_ratio(s.get("engine_tokens_per_s"), s.get("raw_tokens_per_s")), "{:.2f}") for s in steps]
    )
    modes = sorted({k for m in models for k in m.get("memory", {})}, key=lambda k: k != "full")
    for mode in modes:
        mem = [m.get("memory", {}).get(mode) or {} for m in models]
        used = [(x["peak"] - x["runtime"]) / MIB if x else None for x in mem]
        add(
            f"train peak RSS MiB, {mode}: runtime",
            [_f(x.get("runtime", 0) / MIB if x else None, "{:,.0f}") for x in mem],
        )
        add("  peak - runtime", [_f(u, "{:,.0f}") for u in used])
        add("  analytic bound", [_f(x["bound"]["total"] / MIB if x else None, "{:,.0f}") for x in mem])
        add("  of it activations", [_f(x["bound"]["activations"] / MIB if x else None, "{:,.0f}") for x in mem])
        add("  KL reference copy held", [_f(x["reference"] / MIB if x else None, "{:,.0f}") for x in mem])
        add("  (peak - runtime) / bound", [_f(x.get("ratio"), "{:.2f}") for x in mem], f"<= {MEMORY_RATIO_MAX}")
    syncs = [m.get("sync", {}) for m in models]
    for mode in sorted({k for s in syncs for k in s}, key=lambda k: k != "full"):
        add(
            f"vLLM sync s, {mode}",
            [_f(s.get(mode, {}).get("total_s"), "{:.3f}") for s in syncs],
            f"<= {FULL_SYNC_MAX_S} s (0.5B)" if mode == "full" else "",
        )
        add(f"  MB written, {mode}", [_f(s.get(mode, {}).get("mb"), "{:.1f}") for s in syncs])
    adapter = next((k for s in syncs for k in s if k != "full"), None)
    if adapter:
        pairs = [(s.get("full", {}).get("total_s"), s.get(adapter, {}).get("total_s")) for s in syncs]
        add("  full / adapter", [_f(_ratio(a, b), "{:.1f}") for a, b in pairs])
    starts = [m.get("vllm_start_s", {}) for m in models]
    for kind in ("full", "adapter"):
        add(f"vLLM start s ({kind})", [_f(s.get(kind), "{:.1f}") for s in starts])
    for engine in ("torch", "vllm"):
        runs = [m.get("swarm_train", {}).get(engine) for m in models]
        cells = [
            "-" if r is None else f"{r['wall_s']:.0f} s" if r["completed"] else f"FAILED rc {r['rc']}" for r in runs
        ]
        add(f"swarm train --engine {engine}, 2 steps: wall", cells, "completes")
        add("  peak RSS MiB, process tree", [_f(r["peak_rss_sum"] / MIB if r else None, "{:,.0f}") for r in runs])
    for m_name, m in report["models"].items():
        for part, err in m.get("errors", {}).items():
            rows.append((f"ERROR {part} ({m_name})", ["" for _ in models], err[:60]))
    return rows


def check_targets(report: dict) -> list[dict]:
    """Each target with its measured value (None: not measured in this run) and whether it is met."""
    out = []
    m = report["models"].get(TARGET_MODEL)
    if m is not None:
        gen = _ratio(_gen(m, "torch", 32), _gen(m, "vllm", 32))
        out.append(
            {
                "target": f"0.5B torch/vLLM generation at 32 >= {GEN_RATIO_MIN}",
                "value": gen,
                "met": None if gen is None else gen >= GEN_RATIO_MIN,
            }
        )
        for mode, x in m.get("memory", {}).items():
            r = x.get("ratio")
            out.append(
                {
                    "target": f"0.5B train peak {mode} <= {MEMORY_RATIO_MAX}x bound",
                    "value": r,
                    "met": None if r is None else r <= MEMORY_RATIO_MAX,
                }
            )
        s = m.get("sync", {}).get("full", {}).get("total_s")
        out.append(
            {
                "target": f"0.5B full sync <= {FULL_SYNC_MAX_S} s",
                "value": s,
                "met": None if s is None else s <= FULL_SYNC_MAX_S,
            }
        )
    for name, mm in report["models"].items():
        for engine, r in mm.get("swarm_train", {}).items():
            out.append(
                {
                    "target": f"{name}: swarm train --engine {engine} --steps 2 completes",
                    "value": r["wall_s"],
                    "met": r["completed"],
                }
            )
    return out


def render(report: dict) -> Table:
    table = Table(title=report.get("title", "scale: figures side by side"))
    table.add_column("figure", justify="left")
    for name in report["models"]:
        table.add_column(name, justify="right")
    table.add_column("target", justify="left")
    for label, values, target in table_rows(report):
        table.add_row(label, *values, target)
    return table
