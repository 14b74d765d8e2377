#!/usr/bin/env bash
# Stop the sshd that scripts/sshd/up.sh started (through its pid file). Its state (keys, log) is kept.
set -uo pipefail
STATE=${SLURMTRAIN_SSHD_DIR:-/var/tmp/slurmtrain-sshd}
pidf=$STATE/run/sshd.pid
source "$(dirname "${BASH_SOURCE[0]}")/../pidfile.sh"
if pid=$(pid_of "$pidf" sshd); then
  kill "$pid" && echo "down.sh: sshd ($pid) stopped"
else
  echo "down.sh: no sshd of ours is running"
fi
rm -f "$pidf"
