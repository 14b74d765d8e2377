#!/usr/bin/env bash
# Tear down the local SLURM test cluster started by scripts/slurm/up.sh.
#
# Stops, via the pid files in the state dir, only daemons that up.sh started:
# slurmctld, slurmd n1/n2/n3, slurmdbd, the private mariadbd, and munged if (and
# only if) up.sh had to start it. Idempotent: nothing running -> exit 0.
# State (configs, accounting DB, logs) is kept, so the next up.sh is fast and
# sacct history survives; `rm -rf` the state dir for a truly fresh cluster.
set -uo pipefail   # no -e: keep tearing down even if one step fails

STATE=${SLURMTRAIN_SLURM_DIR:-/var/tmp/slurmtrain-slurm}
TIMEOUT=${SLURMTRAIN_SLURM_TIMEOUT:-60}
RUN=$STATE/run
export SLURM_CONF=$STATE/etc/slurm.conf

log() { echo "down.sh: $*"; }

# running PID COMM: PID is a live (non-zombie) process named COMM. The name
# check guards against stale pid files / pid reuse; zombies matter because
# the container's pid 1 may reap orphaned daemons only every few seconds.
running() {
  [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]] &&
    ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# pid_of PIDFILE COMM: print the pid from PIDFILE if it is a live COMM of ours.
source "$(dirname "${BASH_SOURCE[0]}")/../pidfile.sh"

# stop NAME PIDFILE COMM: SIGTERM, wait (bounded) for exit, then SIGKILL.
stop() {
  local name=$1 pidf=$2 comm=$3 pid deadline
  if ! pid=$(pid_of "$pidf" "$comm"); then
    log "$name not running"
    rm -f "$pidf"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null
  deadline=$((SECONDS + TIMEOUT))
  while running "$pid" "$comm"; do
    if ((SECONDS >= deadline)); then
      log "$name (pid $pid) ignored SIGTERM for ${TIMEOUT}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null
      break
    fi
    sleep 0.2
  done
  rm -f "$pidf"
  log "$name stopped"
}

[[ $EUID -eq 0 ]] || { echo "down.sh: must run as root" >&2; exit 1; }
if [[ ! -d $STATE ]]; then
  log "no state dir $STATE; nothing to stop"
  exit 0
fi

# Cancel every job first so no slurmstepd/job process outlives its slurmd.
# Bounded: KillWait=30 is the longest a job may take to die after SIGTERM.
if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null; then
  jobs=$(squeue -h -o %i 2>/dev/null)
  if [[ -n $jobs ]]; then
    log "cancelling jobs: $(echo $jobs)"
    scancel $jobs 2>/dev/null
    deadline=$((SECONDS + TIMEOUT))
    while [[ -n "$(squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < deadline)); do
      sleep 0.5
    done
    [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] || log "warning: jobs still listed after ${TIMEOUT}s: $(squeue -h -o '%i %T' | tr '\n' ' ')"
  fi
fi

# Controller first (so it doesn't see the nodes vanish and mark them DOWN),
# slurmdbd after slurmctld (slurmctld flushes its last records to it),
# database last.
stop slurmctld "$RUN/slurmctld.pid" slurmctld
stop "slurmd n1" "$RUN/slurmd-n1.pid" slurmd
stop "slurmd n2" "$RUN/slurmd-n2.pid" slurmd
stop "slurmd n3" "$RUN/slurmd-n3.pid" slurmd
stop slurmdbd "$RUN/slurmdbd.pid" slurmdbd
stop mariadb "$STATE/mysql/mysqld.pid" mariadbd
if [[ -e $RUN/munged.started-by-up ]]; then
  stop munged /run/munge/munged.pid munged
  rm -f "$RUN/munged.started-by-up"
else
  log "munged left alone (not started by up.sh)"
fi
log "SLURM test cluster stopped (state kept in $STATE)"
