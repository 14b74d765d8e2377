#!/usr/bin/env bash
# Take pyxis out of the local SLURM cluster again (what scripts/containers/up.sh put in): remove its plugstack.conf
# lines and restart the nodes' slurmds without it. The runtimes stay installed and the test images stay built under
# $SLURMTRAIN_CONTAINERS_DIR (`rm -rf` it, and `podman rmi localhost/slurmtrain-test`, for a rebuild from nothing).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SLURM_STATE=${SLURMTRAIN_SLURM_DIR:-/var/tmp/slurmtrain-slurm}
RUN=$SLURM_STATE/run
[[ $EUID -eq 0 ]] || { echo "down.sh: must run as root" >&2; exit 1; }
if [[ ! -e /etc/slurm/plugstack.conf.d/pyxis.conf && ! -e $SLURM_STATE/etc/plugstack.conf ]]; then
  echo "down.sh: pyxis is not in the local SLURM cluster"
  exit 0
fi
# (Debian's /etc/slurm/plugstack.conf, an include of plugstack.conf.d, stays.)
rm -f /etc/slurm/plugstack.conf.d/pyxis.conf "$SLURM_STATE/etc/plugstack.conf"
source "$REPO/scripts/pidfile.sh"
pids=()
for n in n1 n2 n3; do
  p=$(pid_of "$RUN/slurmd-$n.pid" slurmd) && kill -TERM "$p" && pids+=("$p")
done
for p in "${pids[@]}"; do
  for _ in $(seq 300); do [[ -d /proc/$p ]] || break; sleep 0.1; done
done
if ((${#pids[@]})); then
  bash "$REPO/scripts/slurm/up.sh" > /dev/null || { echo "down.sh: scripts/slurm/up.sh could not restart slurmd" >&2; exit 1; }
fi
echo "down.sh: pyxis removed from the local SLURM cluster (images kept)"
