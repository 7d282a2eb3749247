#!/usr/bin/env bash
# tinker-cookbook check: the cookbook's own SFT and RL loops (tinker-cookbook pinned, unchanged) train the
# embedded model through Roost's Tinker API. The cookbook (with tinker, torch from the local CPU wheel,
# transformers, pytest, pytest-timeout) goes in its own venv, .venv-cookbook (no roost); it runs
# tests/tinker_cookbook against a real `swarm serve` started from the full install on loopback (the tests
# start it and stop it by PID). Exit non-zero on any failure; ROOST_REQUIRE_COOKBOOK=1 makes a missing
# cookbook a failure, not a skip.
#
# Why 0.5.8: tinker-cookbook 0.6.x requires tml-renderers>=0.4.1, which the package index does not have
# (its newest is 0.2.1); 0.5.8 requires tml-renderers>=0.0.1, torch>=2.10 and transformers<=5.5.4.
#
# The RL test needs the warm-started embedded model: `swarm model init` (idempotent) finds it in
# ROOST_HOME (or ~/.cache/roost) or builds it there (~4 min once).
#
#   bash .ci/tinker_cookbook.sh            # full install: .venv-ci (made by .ci/run), else .venv
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
FULL="${ROOST_FULL_VENV:-$([ -x .venv-ci/bin/python ] && echo .venv-ci || echo .venv)}"
VENV=.venv-cookbook
COOKBOOK_VERSION=0.5.8
TINKER_VERSION=0.38.0

rm -rf "$VENV"
python3 -m venv "$VENV"
# torch first: the CPU wheel on local disk (an unpinned torch may pull a CUDA build)
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q "tinker-cookbook==$COOKBOOK_VERSION" "tinker==$TINKER_VERSION" "transformers<=5.5.4" \
  pytest pytest-timeout httpx
echo "installed in $(( $(date +%s) - start ))s"
if [ -n "${CI_MAIN_TESTS_DONE:-}" ]; then  # under .ci/run: the main suite keeps the cores until it is done
  while [ ! -e "$CI_MAIN_TESTS_DONE" ]; do sleep 2; done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# (from outside the checkout: python -c puts the current folder on sys.path)
if (cd "$work" && "$OLDPWD/$VENV/bin/python" -c "import swarm" 2>/dev/null); then echo "FAIL: roost is in the cookbook's venv"; exit 1; fi
model_start=$(date +%s)
"$FULL/bin/python" -c "from swarm.model.build import init_model; print('embedded model:', init_model())"
echo "model ready in $(( $(date +%s) - model_start ))s"
export ROOST_FULL_PYTHON="$PWD/$FULL/bin/python" ROOST_REQUIRE_COOKBOOK=1 TINKER_TELEMETRY=0
export ROOST_COOKBOOK_REPORT="$work/figures.txt"
tests_start=$(date +%s)
# --confcutdir: only tests/tinker_cookbook/conftest.py (tests/conftest.py brings the full install's fixtures)
(cd "$work" && "$OLDPWD/$VENV/bin/python" -m pytest "$OLDPWD/tests/tinker_cookbook" -q -p no:cacheprovider \
  --confcutdir "$OLDPWD/tests/tinker_cookbook" --rootdir "$OLDPWD" -o addopts="--import-mode=importlib")
echo "tests finished in $(( $(date +%s) - tests_start ))s"
cat "$ROOST_COOKBOOK_REPORT"
echo "tinker cookbook ci finished in $(( $(date +%s) - start ))s"
