#!/usr/bin/env bash
# Stop the sshd that scripts/sshd/up.sh started (through its pid file). Its state (keys, log) is kept.
set -uo pipefail
STATE=${SLURMTRAIN_SSHD_DIR:-/var/tmp/slurmtrain-sshd}
pidf=$STATE/run/sshd.pid
if [[ -r $pidf ]] && pid=$(tr -dc '0-9' < "$pidf") && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == sshd ]]; then
  kill "$pid" && echo "down.sh: sshd ($pid) stopped"
else
  echo "down.sh: no sshd of ours is running"
fi
rm -f "$pidf"
