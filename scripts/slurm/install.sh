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

export DEBIAN_FRONTEND=noninteractive
# Wait for a concurrent apt/dpkg (e.g. another provisioning step) instead of failing on the lock.
APT=(apt-get -y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

# up.sh runs its own private munged/mariadbd/slurm daemons. Stop the package
# postinsts from starting the system services (there is no init system here,
# and a stray system mariadb/slurmctld would only waste memory or grab ports).
# Only if nobody else has put a policy in place already.
cleanup_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  cleanup_policy=1
fi
trap '[[ $cleanup_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT

# A fresh machine may have empty package lists; refresh only when apt cannot
# see the packages, or when the install fails (stale lists -> 404s).
if ! apt-cache policy slurmdbd 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  "${APT[@]}" update
fi
if ! "${APT[@]}" install --no-install-recommends "${missing[@]}"; then
  "${APT[@]}" update
  "${APT[@]}" install --no-install-recommends "${missing[@]}"
fi
echo "install.sh: done"
