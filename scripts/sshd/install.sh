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

source "$(dirname "${BASH_SOURCE[0]}")/../apt_install.sh"
apt_install openssh-server "${missing[@]}"
echo "install.sh: done"
