# Sourced by scripts/{slurm,sshd,containers}/install.sh (one copy of what they all did):
#   apt_install PROBE PACKAGE...
# installs the packages without letting their postinst scripts start system services (our up.sh scripts run private
# daemons on their own ports; there is no init system here), unless someone else already put a policy-rc.d in place
# (ours is removed when the script exits). A fresh machine may have empty package lists: they are refreshed only when
# apt cannot see PROBE, or when the install fails (stale lists give 404s).
apt_install() {
  local probe=$1
  shift
  export DEBIAN_FRONTEND=noninteractive
  # Wait for a concurrent apt/dpkg (another provisioning step) instead of failing on the lock.
  local apt=(apt-get -y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef
             -o Dpkg::Options::=--force-confold)
  cleanup_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    cleanup_policy=1
  fi
  trap '[[ $cleanup_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT
  if ! apt-cache policy "$probe" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    "${apt[@]}" update
  fi
  if ! "${apt[@]}" install --no-install-recommends "$@"; then
    "${apt[@]}" update
    "${apt[@]}" install --no-install-recommends "$@"
  fi
}
