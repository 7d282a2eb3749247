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
# 3. tests/unit/test_policy_step_beside_generation.py on cuda (ROOST_TEST_DEVICE): a policy's step
#    beside another's generation and step trains and generates what each does alone, on the GPU.
# 4. bench/policy_overlap.py on cuda: two LoRA policies of one base, one training while the other
#    generates (beside, against a step that holds the model), on a model of the 0.5B's widths.
# 5. `swarm train --task duet --shared-base --steps 30 --device cuda`: planner and executor as two
#    LoRA policies of one server on the GPU; it must finish and each role's reward must rise.
#
# Two more parts run only when GPU_PARTS names them (they do not fit the default run's 8 minutes):
# 6. k_policies: bench/policies.py --device cuda: k LoRA policies of one server against k servers
#    sharing the GPU, k = 1, 2, 4, 8, on the embedded model.
# 7. tinker: bench/tinker.py --device cuda: the Tinker API's forward_backward + optim_step over HTTP
#    against the same primitives called in process.
#
# GPU_PARTS=engine,train,policy_tests,policies,duet (the default) picks parts, e.g. to rerun one.
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

want() { case ",${GPU_PARTS:-engine,train,policy_tests,policies,duet}," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

want engine && part engine 300 "$PY" bench/gpu_acceptance.py --json "$OUT_DIR/engine.json"

# train NAME ARGS...: `swarm train ARGS` on the GPU into OUT_DIR/NAME; each trained policy's reward (a
# --shared-base run's every role) must rise from its first steps to its last
train() {
    local name=$1
    shift
    "$PY" -m swarm train "$@" --steps 30 --device "$DEVICE" --no-mlflow --out "$OUT_DIR/$name" --fresh \
        ${ROOST_GPU_MODEL:+--model "$ROOST_GPU_MODEL"} || return
    "$PY" - "$OUT_DIR/$name/summary.json" "$*" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
rose = True
for who, p in (s.get("policies") or {"the run": s}).items():
    first, last = p["reward_first_mean"], p["reward_last_mean"]
    print(f"{sys.argv[2]} on cuda, 30 steps, {who}: reward {first:.3f} -> {last:.3f}")
    rose = rose and last > first
print(f"wall {s['wall_s']:.0f}s")
sys.exit(0 if rose else "the reward did not rise")
PY
}
export -f train
export PY OUT_DIR DEVICE=cuda
want train && part train 240 bash -c 'train train --task arith'

want policy_tests && part policy_tests 150 env ROOST_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider \
    tests/unit/test_policy_step_beside_generation.py

want policies && part policies 150 "$PY" bench/policy_overlap.py --device cuda --hidden 896 --layers 24 \
    --seconds 8 --rounds 2 --concurrency 32 --json "$OUT_DIR/policies.json"

want duet && part duet 200 bash -c 'train duet --task duet --shared-base'

want k_policies && part k_policies 300 "$PY" bench/policies.py --device cuda --seconds 12 \
    ${ROOST_GPU_MODEL:+--model "$ROOST_GPU_MODEL"} --json "$OUT_DIR/k_policies.json"
want tinker && part tinker 120 "$PY" bench/tinker.py --device cuda --steps 10 \
    ${ROOST_GPU_MODEL:+--model "$ROOST_GPU_MODEL"} --json "$OUT_DIR/tinker.json"
echo "gpu acceptance: $failed part(s) failed; logs and JSON in $OUT_DIR"
exit "$failed"
