#!/usr/bin/env bash
# Tinker-compatible API check: the unchanged `tinker` SDK (pinned) in its own torch-free virtualenv
# (.venv-tinker: tinker, pytest, pytest-timeout, httpx; no roost, no torch) runs tests/tinker/test_sdk.py
# against real `swarm serve` processes started from the full install on loopback (the tests start,
# kill -9 and restart them). Exit non-zero on any failure; ROOST_REQUIRE_TINKER=1 makes a missing
# SDK a failure, not a skip.
#
#   bash .ci/tinker.sh            # full install: .venv-ci (made by .ci/run), else .venv
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
FULL="${ROOST_FULL_VENV:-$([ -x .venv-ci/bin/python ] && echo .venv-ci || echo .venv)}"
VENV=.venv-tinker
TINKER_VERSION=0.38.0

rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "tinker==$TINKER_VERSION" pytest pytest-timeout httpx
if [ -n "${CI_MAIN_TESTS_DONE:-}" ]; then  # under .ci/run: the main suite keeps the cores until it is done
  while [ ! -e "$CI_MAIN_TESTS_DONE" ]; do sleep 2; done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# (from outside the checkout: python -c puts the current folder on sys.path)
if (cd "$work" && "$OLDPWD/$VENV/bin/python" -c "import torch" 2>/dev/null); then echo "FAIL: torch is in the SDK's venv"; exit 1; fi
if (cd "$work" && "$OLDPWD/$VENV/bin/python" -c "import swarm" 2>/dev/null); then echo "FAIL: roost is in the SDK's venv"; exit 1; fi
export ROOST_FULL_PYTHON="$PWD/$FULL/bin/python" ROOST_REQUIRE_TINKER=1 TINKER_TELEMETRY=0
# --noconftest: tests/tinker/conftest.py brings in-process fixtures of the full install
(cd "$work" && "$OLDPWD/$VENV/bin/python" -m pytest "$OLDPWD/tests/tinker/test_sdk.py" --noconftest -q \
  -p no:cacheprovider --rootdir "$OLDPWD" -o addopts="--import-mode=importlib")
echo "tinker ci finished"
