#!/usr/bin/env bash
# Install the Debian packages the local SLURM test cluster (scripts/slurm/up.sh) needs.
#
# Idempotent and non-interactive: when every package is already installed it
# does nothing (no apt-get update, no network), so CI can call it on every run.
set -euo pipefail

PKGS=(
  munge            # auth/munge for every daemon and client
  slurm-wlm        # metapackage: slurmctld + slurmd + slurm-client
  slurm-client     # sbatch/srun/sinfo/sacct/scontrol/sacctmgr (explicit, in case the metapackage changes)
  slurmdbd         # accounting daemon; pulls in slurm-wlm-mysql-plugin
  mariadb-server   # storage behind slurmdbd (mariadbd, mariadb-install-db)
  mariadb-client   # mariadb / mysqladmin, used by up.sh to create the DB user and poll readiness
)

if [[ $EUID -ne 0 ]]; then
  echo "install.sh: must run as root (apt-get)" >&2
  exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]]; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install.sh: all SLURM test-cluster packages already installed"
  exit 0
fi
echo "install.sh: installing ${missing[*]}"

source "$(dirname "${BASH_SOURCE[0]}")/../apt_install.sh"
apt_install slurmdbd "${missing[@]}"
echo "install.sh: done"
