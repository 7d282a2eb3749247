#!/usr/bin/env bash
# Make sure the PostgreSQL 15 server binaries exist (tests start a throwaway instance
# with them: tests/store/conftest.py). Idempotent: does nothing when initdb is there.
# Called by .ci/run; safe to run by hand. Needs root (or sudo) only when installing.
set -euo pipefail

PG_BIN=/usr/lib/postgresql/15/bin

if [[ -x "$PG_BIN/initdb" && -x "$PG_BIN/pg_ctl" ]]; then
    echo "postgres.sh: PostgreSQL 15 present ($("$PG_BIN/postgres" --version))"
    exit 0
fi

SUDO=""
if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || { echo "postgres.sh: need root or sudo to install postgresql-15" >&2; exit 1; }
    SUDO=sudo
fi

echo "postgres.sh: installing postgresql-15"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# The package's post-install creates a default cluster; with no systemd it is not
# started, and the tests never use it (they initdb their own directory).
$SUDO apt-get install -y -q --no-install-recommends postgresql-15

[[ -x "$PG_BIN/initdb" ]] || { echo "postgres.sh: $PG_BIN/initdb still missing" >&2; exit 1; }
id postgres >/dev/null 2>&1 || { echo "postgres.sh: no 'postgres' user after install" >&2; exit 1; }
echo "postgres.sh: installed $("$PG_BIN/postgres" --version)"
