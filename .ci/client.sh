#!/usr/bin/env bash
# Client-only install check: a fresh virtualenv gets `pip install .` (the client:
# httpx, openai, pydantic, typer, rich, pyyaml; no torch) and must take under 200 MB
# and under a minute of CPU; then the client tests run there against a `swarm serve`
# started from the full install, and bench/client_start.py measures launch → first
# claimed episode (under 2 s). Exit non-zero on any failure.
#
# The minute is the install's CPU time (pip and the build it runs), its wall time printed beside it:
# under .ci/run this runs beside the embedded model's build and four virtualenvs' installs on two
# cores, where the wall clock measures the neighbours (16 s alone, 47-63 s there), not the install.
#
#   bash .ci/client.sh            # full install: .venv-ci (made by .ci/run), else .venv
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
FULL="${ROOST_FULL_VENV:-$([ -x .venv-ci/bin/python ] && echo .venv-ci || echo .venv)}"
VENV=.venv-client
MAX_MB=200 MAX_S=60

rm -rf "$VENV"
python3 -m venv "$VENV"
base_mb=$(du -sm "$VENV" | cut -f1)   # python + pip + setuptools of an empty venv
read -r wall_s install_s < <(python3 -c "
import resource, subprocess, time
t0 = time.monotonic()
subprocess.run(['$VENV/bin/pip', 'install', '-q', '.'], check=True)
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(round(time.monotonic() - t0, 1), round(used.ru_utime + used.ru_stime, 1))")
size_mb=$(( $(du -sm "$VENV" | cut -f1) - base_mb ))
echo "client-only install: ${install_s} s of CPU (${wall_s} s wall), ${size_mb} MB over an empty venv ($(du -sm "$VENV" | cut -f1) MB in all)"
fail=0
python3 -c "import sys; sys.exit(0 if $install_s < $MAX_S else 1)" || { echo "FAIL: install took ${install_s} s of CPU (limit ${MAX_S} s)"; fail=1; }
[ "$size_mb" -lt "$MAX_MB" ] || { echo "FAIL: install is ${size_mb} MB (limit ${MAX_MB} MB)"; fail=1; }
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then echo "FAIL: torch is installed by the client install"; fail=1; fi
"$VENV/bin/pip" install -q pytest pytest-timeout   # test tools only, after the measurement

# a real server from the full install (fake engine: the client's side is what is tested)
work=$(mktemp -d)
port=$("$FULL/bin/python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
token=client-ci-token
"$FULL/bin/python" -c "from swarm.testing import tiny_model_dir; tiny_model_dir('$work')" >/dev/null 2>&1
ROOST_HOME="$work/home" "$FULL/bin/python" -m swarm serve --engine fake --model "$work/tiny-model" --port "$port" \
  --token "$token" --admin-token client-ci-admin --group-size 1 --batch-groups 4 --out "$work/server" \
  > "$work/server.log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 || \
     curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$port/swarm/v1/status" >/dev/null 2>&1; then break; fi
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; echo "FAIL: swarm serve exited"; exit 1; }
  sleep 0.5
done

export ROOST_CLIENT_TEST_URL="http://127.0.0.1:$port" ROOST_CLIENT_TEST_TOKEN="$token" ROOST_CLIENT_ONLY=1
# --noconftest: tests/client/conftest.py brings the in-process server fixtures (the full install)
(cd "$work" && ROOST_HOME="$work/client-home" "$OLDPWD/$VENV/bin/python" -m pytest "$OLDPWD/tests/client/test_no_torch.py" \
  --noconftest -q -p no:cacheprovider --rootdir "$OLDPWD" -o addopts="--import-mode=importlib") || fail=1

"$FULL/bin/python" bench/client_start.py --python "$VENV/bin/python" --runs 5 || fail=1
echo "client ci finished with exit $fail"
exit "$fail"
