#!/usr/bin/env bash
# Bring up a single-node Slurm cluster on loopback (Debian 12, Slurm 22.05, no systemd).
#
#   sudo .ci/slurm.sh          # install if needed, configure, start, wait until the node is idle
#
# Idempotent: when the node already answers `sinfo` as idle/mixed/allocated with the
# configuration this script would write, it prints "slurm: already up" and does nothing.
# Every action it takes is printed. Tuned for tests: a job past its --time is killed
# promptly (OverTimeLimit=0, KillWait=2) and finished jobs stay visible to
# `scontrol show job` for MinJobAge=120 s (the scheduler falls back to it after squeue).
set -euo pipefail

say() { echo "slurm: $*"; }

CONF=/etc/slurm/slurm.conf
NCPU=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
# A bit below the machine's memory: slurmd drains a node that reports less than RealMemory.
REAL_MB=$(( MEM_MB * 9 / 10 ))

node_state() { timeout 5 sinfo -h -n localhost -o '%T' 2>/dev/null | head -n1 || true; }

render_conf() {
  cat <<EOF
# Written by .ci/slurm.sh: a single-node Slurm on loopback for development and CI.
ClusterName=roost
SlurmctldHost=localhost
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
# Tests: kill jobs right at their limit, SIGKILL 2 s after SIGTERM, keep finished jobs 120 s,
# and run the scheduling loops every 2 s (so jobs submitted with --begin=now+2 start promptly).
OverTimeLimit=0
KillWait=2
MinJobAge=120
SchedulerParameters=sched_interval=2,bf_interval=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=${NCPU} RealMemory=${REAL_MB} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

# ---------------------------------------------------------------- install
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  say "installing slurmctld slurmd slurm-client munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
else
  say "packages already installed ($(sinfo --version 2>/dev/null || echo '?'))"
fi

# ---------------------------------------------------------------- users, dirs, key
id munge >/dev/null 2>&1 || { say "creating user munge"; useradd -r -s /usr/sbin/nologin munge; }
id slurm >/dev/null 2>&1 || { say "creating user slurm"; useradd -r -s /usr/sbin/nologin slurm; }
mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
chown munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 0700 /etc/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  say "creating munge key"
  if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /var/log/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm
touch /var/log/slurm/jobcomp.log && chown slurm:slurm /var/log/slurm/jobcomp.log

# ---------------------------------------------------------------- slurm.conf
CONF_CHANGED=0
NEW_CONF=$(render_conf)
if [[ ! -f $CONF ]] || [[ "$(cat "$CONF")" != "$NEW_CONF" ]]; then
  say "writing $CONF (CPUs=$NCPU RealMemory=$REAL_MB)"
  printf '%s\n' "$NEW_CONF" > "$CONF"
  CONF_CHANGED=1
fi

# ---------------------------------------------------------------- daemons
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if ! pgrep -x munged >/dev/null; then
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged
else
  say "munged already running"
fi
for _ in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done

if alive /run/slurmctld.pid; then
  if (( CONF_CHANGED )); then say "reconfiguring slurmctld"; scontrol reconfigure; fi
  say "slurmctld already running"
else
  say "starting slurmctld"
  /usr/sbin/slurmctld
fi
if alive /run/slurmd.pid; then
  say "slurmd already running"
else
  say "starting slurmd -N localhost"
  /usr/sbin/slurmd -N localhost
fi

# ---------------------------------------------------------------- wait for the node
for i in $(seq 60); do
  state=$(node_state)
  case "$state" in
    idle*|mixed*|allocated*|completing*) say "node localhost is $state"; exit 0 ;;
    drain*|down*)
      # ReturnToService=2 usually heals this; nudge it once (e.g. after a reconfigure).
      (( i == 5 )) && { say "node is $state; resuming"; scontrol update nodename=localhost state=resume || true; } ;;
  esac
  sleep 0.5
done
say "node not idle after 30 s (state: '${state:-none}'); see /var/log/slurm/*.log" >&2
exit 1
