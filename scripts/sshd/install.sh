#!/usr/bin/env bash
# Install Debian's OpenSSH server for the local "login node" of the remote tests (scripts/sshd/up.sh).
#
# Idempotent and non-interactive, like scripts/slurm/install.sh: nothing to do -> no apt-get update, no network.
set -euo pipefail

PKGS=(
  openssh-server   # sshd: the login node the `remote` tests submit through
  openssh-client   # ssh, ssh-keygen, ssh-keyscan
  rsync            # the snapshot copy runs rsync on both ends
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
  echo "install.sh: openssh-server, openssh-client and rsync already installed"
  exit 0
fi
echo "install.sh: installing ${missing[*]}"

export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

# up.sh runs its own sshd on its own port: keep the package's postinst from starting the system one on port 22.
cleanup_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  cleanup_policy=1
fi
trap '[[ $cleanup_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT

if ! apt-cache policy openssh-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  "${APT[@]}" update
fi
if ! "${APT[@]}" install --no-install-recommends "${missing[@]}"; then
  "${APT[@]}" update
  "${APT[@]}" install --no-install-recommends "${missing[@]}"
fi
echo "install.sh: done"
