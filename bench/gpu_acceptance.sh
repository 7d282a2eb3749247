#!/usr/bin/env bash
# The GPU acceptance run: at most ~8 minutes on one H100 or H200, with the torch and Python the
# machine has. Each part runs under its own time limit and a failed part does not stop the next;
# the exit status is the number of failed parts (0: all passed).
#
#   bash bench/gpu_acceptance.sh                 # figures into runs/gpu (GPU_OUT=DIR to change)
#
# 1. bench/gpu_acceptance.py: the torch engine in bf16 on a Qwen2.5-0.5B-shaped model (random
#    weights): generation tokens/s against Hugging Face `generate`, the train step against raw
#    torch, and both again with a rank-8 LoRA adapter; peak GPU memory.
# 2. `swarm train --task arith --steps 30 --device cuda` on the embedded model (ROOST_HOME's, built
#    first if missing, or ROOST_GPU_MODEL=DIR): it must finish and its reward must rise.
#
# Without CUDA it says so and exits with status 2 before doing anything (CI checks that, and runs
# part 1's wiring on CPU: tests/unit/test_gpu_acceptance.py). docs/gpu.md has the figures of a run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${GPU_OUT:-runs/gpu}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "bench/gpu_acceptance.sh needs a CUDA GPU and torch with CUDA; $PY sees none on this machine" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"
failed=0
part() {  # part NAME SECONDS COMMAND...: run one part under a time limit, its output teed to OUT_DIR/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc in $((SECONDS - t0))s"
    [ "$rc" = 0 ] || failed=$((failed + 1))
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'

part engine 300 "$PY" bench/gpu_acceptance.py --json "$OUT_DIR/engine.json"

train_arith() {
    "$PY" -m swarm train --task arith --steps 30 --device "$DEVICE" --no-mlflow --out "$OUT_DIR/train" --fresh \
        ${ROOST_GPU_MODEL:+--model "$ROOST_GPU_MODEL"} || return
    "$PY" - "$OUT_DIR/train/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
first, last = s["reward_first_mean"], s["reward_last_mean"]
print(f"arith on cuda, 30 steps: reward {first:.3f} -> {last:.3f} in {s['wall_s']:.0f}s")
sys.exit(0 if last > first else f"the reward did not rise ({first:.3f} -> {last:.3f})")
PY
}
export -f train_arith
export PY OUT_DIR DEVICE=cuda
part train 240 bash -c train_arith
echo "gpu acceptance: $failed part(s) failed; logs and JSON in $OUT_DIR"
exit "$failed"
