#!/usr/bin/env bash
# Agent-framework conformance (tests/frameworks/): each framework, unchanged, runs a tool episode
# against a real Roost server on loopback (scripted engine; the server from the full install), and
# the episode's merged samples and masks are checked. The frameworks live in torch-free venvs of
# their own, with the client-only install of Roost:
#   .venv-frameworks     openai-agents, pydantic-ai, litellm, langchain-openai + langgraph,
#                        smolagents, dspy, anthropic
#   .venv-frameworks-li  llama-index (it pins an older openai that breaks the Agents SDK)
# Both venvs install at once (pip waits on the network), then both suites run at once. Exit
# non-zero on any failure; a framework that does not import fails here (ROOST_REQUIRE_FRAMEWORKS=1).
#
#   bash .ci/frameworks.sh            # full install: .venv-ci (made by .ci/run), else .venv
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
FULL="${ROOST_FULL_VENV:-$([ -x .venv-ci/bin/python ] && echo .venv-ci || echo .venv)}"
start=$(date +%s)
logs=$(mktemp -d)
MAIN=(
  "openai-agents==0.24.*" "pydantic-ai-slim[openai]" litellm langchain-openai langgraph smolagents dspy anthropic
)
LLAMA=(llama-index-core llama-index-llms-openai-like)

# the client install as one wheel, built once: two builds of `.` at once would share its build/ folder
# (.ci/run builds it before it starts this script and its own client install: ROOST_WHEEL)
wheel=${ROOST_WHEEL:-}
if [ -z "$wheel" ]; then
  "$FULL/bin/pip" wheel -q --no-deps -w "$logs/wheel" .
  wheel=$(ls "$logs"/wheel/*.whl)
fi

make_venv() {  # make_venv DIR PACKAGES...: a fresh venv with the client install, the packages and pytest
  local dir=$1; shift
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q "$wheel" "$@" pytest pytest-timeout
  if "$dir/bin/python" -c "import torch" 2>/dev/null; then echo "FAIL: torch got into $dir"; return 1; fi
}

make_venv .venv-frameworks "${MAIN[@]}" > "$logs/main-install.log" 2>&1 & main_pid=$!
make_venv .venv-frameworks-li "${LLAMA[@]}" > "$logs/li-install.log" 2>&1 & li_pid=$!
fail=0
wait "$main_pid" || { cat "$logs/main-install.log"; echo "frameworks venv install failed"; fail=1; }
wait "$li_pid" || { cat "$logs/li-install.log"; echo "llama-index venv install failed"; fail=1; }
[ "$fail" -eq 0 ] || exit 1
echo "framework venvs installed in $(( $(date +%s) - start ))s"
if [ -n "${CI_MAIN_TESTS_DONE:-}" ]; then  # under .ci/run: the main suite keeps the cores until it is done
  while [ ! -e "$CI_MAIN_TESTS_DONE" ]; do sleep 2; done
  echo "main suite done: framework tests start"
fi

export ROOST_REQUIRE_FRAMEWORKS=1 ROOST_FULL_PYTHON="$PWD/$FULL/bin/python"
# --confcutdir: tests/conftest.py belongs to the full install's suite
suite() { "$1/bin/python" -m pytest --confcutdir tests/frameworks -p no:cacheprovider -q --timeout 300 "${@:2}"; }
suite .venv-frameworks tests/frameworks --ignore tests/frameworks/test_llama_index.py > "$logs/main.log" 2>&1 & m=$!
suite .venv-frameworks-li tests/frameworks/test_llama_index.py > "$logs/li.log" 2>&1 & l=$!
wait "$m" || fail=1
wait "$l" || fail=1
cat "$logs/main.log" "$logs/li.log"
echo "frameworks ci finished in $(( $(date +%s) - start ))s with exit $fail"
exit "$fail"
