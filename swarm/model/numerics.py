"""The embedded model's build on pinned CPU numerics: the same weights from any x86-64 machine.

    python -m swarm.model.numerics swarm.model.build:pinned_build '{"out_dir": ..., "seed": 0, "config": {...}}'

Why: torch picks its vectorised kernels (ATen's CPU capability) and MKL its GEMM code path by the
processor it runs on, and the two round differently. The warm start is thousands of AdamW steps, which
carry a last-bit difference into different weights: on an AVX-512 machine the same recipe and seed
built a model that samples `calc` right 0.51 of the time, where the same build on AVX2 kernels gives
0.33 (and the suite's calibration check asks for at most 0.4). Every figure in docs/ is measured on the
embedded model, so a rebuild must give the same floats wherever it runs.

So the warm start always runs with ATen on its AVX2 kernels and MKL on its conditional-numerical-
reproducibility branch for AVX2 (`PINNED`), which every x86-64 processor of the last decade has. Both
are read when torch first dispatches and MKL first runs, so a process can only be pinned from its
start: a build in a process that is not (`pinned_here`) runs in a child that is (`build_pinned`), and
reports its progress back as JSON lines. oneDNN, the third library torch can dispatch to, did not
change the build's weights (checked by hashing a small build's weights under each setting), so it is
left alone. A server, a client and a benchmark are not pinned: their numerics are the machine's own.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

#: What the build's process starts with: ATen's kernels and MKL's code path for AVX2.
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
#: Recorded in a preset build's marker: a build made before the pins is rebuilt.
NUMERICS = "aten-avx2+mkl-cbwr-avx2"

#: `progress(message, fraction)` with fraction in [0, 1] (swarm.model.build's too).
Progress = Callable[[str, float], None]


def pinned_here() -> bool:
    """Whether this process started with the pins (its environment held them before torch ran anything)
    and torch runs its AVX2 kernels (a processor without AVX2, or not x86, cannot: there a build is
    simply the machine's own)."""
    if any(os.environ.get(k) != v for k, v in PINNED.items()):
        return False
    import torch  # lazy: torch takes seconds; a caller about to build has it loaded anyway

    return torch.backends.cpu.get_cpu_capability() == "AVX2"


def build_pinned(target: str, args: dict[str, Any], report: Progress) -> None:
    """Run the build `target` ("module:function", called with the JSON `args` and `report`) on pinned
    numerics: here when this process is pinned, else in a child that is (its progress reaches `report`).
    Raises RuntimeError with the end of the child's output when the child fails."""
    if pinned_here():
        _resolve(target)(**args, report=report)
        return
    command = [sys.executable, "-m", "swarm.model.numerics", target, json.dumps(args)]
    env = {**os.environ, **PINNED, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    tail: deque[str] = deque(maxlen=20)
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            try:
                message, fraction = json.loads(line)["progress"]
            except (ValueError, KeyError, TypeError):
                tail.append(line.rstrip())
                continue
            report(message, fraction)
    if child.returncode != 0:
        raise RuntimeError(f"the model build (pinned numerics) failed, exit {child.returncode}:\n" + "\n".join(tail))


def _resolve(target: str) -> Callable[..., None]:
    """ "module:function" -> the function (by name, so this module imports no builder: no import cycle)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str]) -> int:
    """The pinned child: run the build, its progress as JSON lines on stdout. Never spawns another child
    (where the pins cannot take, a processor without AVX2, it builds on what it has)."""
    target, args = argv[0], json.loads(argv[1])

    def report(message: str, fraction: float) -> None:
        print(json.dumps({"progress": [message, fraction]}), flush=True)

    _resolve(target)(**args, report=report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
