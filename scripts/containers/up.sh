#!/usr/bin/env bash
# Put the container runtimes of scripts/containers/install.sh to work for the `containers` test tier:
#
#   /etc/containers/containers.conf   Podman: runc, cgroupfs, file events, ulimits a container may set here, host net
#   /usr/local/etc/enroot/enroot.conf enroot: per-user runtime/data/cache paths under $STATE/enroot (a SLURM job has
#                                     no XDG_RUNTIME_DIR), writable root filesystems
#   /etc/slurm/plugstack.conf.d/pyxis.conf  pyxis in the local SLURM cluster of scripts/slurm/up.sh, for its clients
#                                     (Debian's /etc/slurm/plugstack.conf includes it) and its daemons (the same
#                                     include in SLURM_ETC/plugstack.conf, beside their slurm.conf); the slurmds are
#                                     restarted when it changes
#   $STATE/images/...                 the test image, built once (scripts/containers/images.sh)
#
# then checks each runtime: podman, ch-run and enroot start the image, and `srun --container-image` runs in it on the
# local cluster. Idempotent and fast when all is in place: unchanged files are not rewritten, slurmd is restarted only
# when plugstack.conf changed, and the images are rebuilt only when their key changed. Run after `make slurm-up`;
# `make slurm-up` may run again afterwards (it leaves plugstack.conf alone).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${SLURMTRAIN_CONTAINERS_DIR:-/var/tmp/slurmtrain-containers}
SLURM_STATE=${SLURMTRAIN_SLURM_DIR:-/var/tmp/slurmtrain-slurm}
SLURM_ETC=$SLURM_STATE/etc
PYXIS_SO=/usr/local/lib/slurm/spank_pyxis.so
ENROOT_CONF=/usr/local/etc/enroot/enroot.conf
SQSH=$STATE/images/slurmtrain.sqsh
export SLURM_CONF=$SLURM_ETC/slurm.conf
# slurmd (and so pyxis in each job step) must find enroot in /usr/local/bin.
export PATH=/usr/local/bin:$PATH

log() { echo "up.sh: $*"; }
die() { echo "up.sh: ERROR: $*" >&2; exit 1; }
t_start=$SECONDS

[[ $EUID -eq 0 ]] || die "must run as root (writes /etc/containers, restarts slurmd)"
for b in podman runc ch-run enroot mksquashfs srun scontrol; do
  command -v "$b" >/dev/null || die "$b not found; run scripts/containers/install.sh first"
done
[[ -f $PYXIS_SO ]] || die "no $PYXIS_SO; run scripts/containers/install.sh first"
[[ -f $SLURM_CONF ]] || die "no local SLURM cluster at $SLURM_STATE; run \`make slurm-up\` first"

# put FILE MODE: write stdin to FILE when its content differs (an unchanged file keeps its mtime).
put() {
  local tmp
  mkdir -p "$(dirname "$1")"
  tmp=$(mktemp "$1.XXXXXX")
  cat > "$tmp"
  chmod "$2" "$tmp"
  if cmp -s "$tmp" "$1"; then
    rm -f "$tmp"
  else
    mv -f "$tmp" "$1"
    log "wrote $1"
  fi
}

# ------------------------------------------------------------------ podman
# crun fails here ("cgroups in hybrid mode not supported") and the default ulimits need CAP_SYS_RESOURCE, which
# this machine's root lacks. Host networking, as podman-hpc uses on HPC systems (and no CNI bridge to set up).
if [[ -e /etc/containers/containers.conf ]] && ! grep -q 'slurmtrain' /etc/containers/containers.conf; then
  mv /etc/containers/containers.conf /etc/containers/containers.conf.pre-slurmtrain
  log "moved existing /etc/containers/containers.conf to /etc/containers/containers.conf.pre-slurmtrain"
fi
put /etc/containers/containers.conf 644 <<'CONF'
# Written by slurmtrain's scripts/containers/up.sh (the `containers` test tier). Podman reads it for every user.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF

# ------------------------------------------------------------------ enroot
# Per-user directories (enroot.conf is sourced by enroot's bash, so $(id -u) is the calling user's). A SLURM job has
# no XDG_RUNTIME_DIR, so enroot's defaults would point at /enroot.
mkdir -p "$STATE/enroot/runtime" "$STATE/enroot/data" "$STATE/enroot/cache" "$STATE/enroot/tmp"
chmod 1777 "$STATE" "$STATE/enroot" "$STATE/enroot/runtime" "$STATE/enroot/data" "$STATE/enroot/cache" "$STATE/enroot/tmp"
put "$ENROOT_CONF" 644 <<CONF
# Written by slurmtrain's scripts/containers/up.sh (the \`containers\` test tier).
ENROOT_RUNTIME_PATH        $STATE/enroot/runtime/user-\$(id -u)
ENROOT_DATA_PATH           $STATE/enroot/data/user-\$(id -u)
ENROOT_CACHE_PATH          $STATE/enroot/cache/user-\$(id -u)
ENROOT_TEMP_PATH           $STATE/enroot/tmp
# A training job writes into its container (pip caches, __pycache__) as on the GPU clusters that run pyxis.
ENROOT_ROOTFS_WRITABLE     yes
ENROOT_MOUNT_HOME          no
ENROOT_RESTRICT_DEV        no
CONF

# ------------------------------------------------------------------- pyxis
# Debian's /etc/slurm/plugstack.conf (slurm-wlm-basic-plugins) includes /etc/slurm/plugstack.conf.d/*.conf: pyxis goes
# there, for the clients, which read the plugstack.conf beside /etc/slurm/slurm.conf. The daemons read the one beside
# their SLURM_CONF, $SLURM_ETC/plugstack.conf: the same include.
# use_squashfuse=1: a step without --container-name starts a .sqsh image mounted in place (squashfuse), as
# `enroot start IMAGE.sqsh` does, instead of unpacking all of it (1.6 GB here: minutes) and removing it afterwards.
# A named container (--container-name) is unpacked once and kept (container_scope=global, pyxis's default: it outlives
# the job, so a requeued attempt reuses it, until `enroot remove pyxis_NAME`).
put /etc/slurm/plugstack.conf.d/pyxis.conf 644 <<CONF
# Written by slurmtrain's scripts/containers/up.sh: pyxis 0.24.0 (srun --container-image ...), enroot underneath.
required $PYXIS_SO use_squashfuse=1
CONF
[[ -e /etc/slurm/plugstack.conf ]] || echo 'include /etc/slurm/plugstack.conf.d/*.conf' > /etc/slurm/plugstack.conf
put "$SLURM_ETC/plugstack.conf" 644 <<'CONF'
# Written by slurmtrain's scripts/containers/up.sh: the SPANK plugins of /etc/slurm/plugstack.conf.d (pyxis).
include /etc/slurm/plugstack.conf.d/*.conf
CONF

# slurmd loads the SPANK plugins when it starts: restart the nodes' slurmds once after plugstack.conf changed (or
# when a slurmd was started before it existed). Running job steps live on in their slurmstepd.
RUN=$SLURM_STATE/run
source "$REPO/scripts/pidfile.sh"
slurmd_pid() { pid_of "$RUN/slurmd-$1.pid" slurmd; }
# A slurmd started before plugstack.conf's last change has not loaded it (start time from /proc: boot + ticks).
btime=$(awk '/^btime/ {print $2}' /proc/stat)
ticks=$(getconf CLK_TCK)
conf_mtime=$(stat -c %Y "$SLURM_ETC/plugstack.conf" /etc/slurm/plugstack.conf.d/pyxis.conf | sort -n | tail -n 1)
stale=()
for n in n1 n2 n3; do
  p=$(slurmd_pid "$n") || continue
  started=$((btime + $(awk '{print $22}' "/proc/$p/stat") / ticks))
  if ((started < conf_mtime)); then stale+=("$n:$p"); fi
done
if [[ ${#stale[@]} -gt 0 ]]; then
  log "restarting slurmd on ${stale[*]%%:*} to load pyxis"
  for np in "${stale[@]}"; do kill -TERM "${np#*:}" 2>/dev/null || true; done
  for np in "${stale[@]}"; do
    for _ in $(seq 300); do [[ -d /proc/${np#*:} ]] || break; sleep 0.1; done
  done
fi
# scripts/slurm/up.sh starts every slurmd that is not running, the way it always does, and waits for the nodes.
bash "$REPO/scripts/slurm/up.sh" > "$STATE/slurm-up.log" 2>&1 || { tail -n 30 "$STATE/slurm-up.log" >&2; die "scripts/slurm/up.sh failed"; }
srun --help 2>&1 | grep -q -- '--container-image' || die "srun --help shows no --container-image: pyxis did not load (/etc/slurm/plugstack.conf.d/pyxis.conf)"
log "pyxis loaded: srun --container-image"

# ------------------------------------------------------------------ images
PYTHON=${PYTHON:-python3} bash "$HERE/images.sh"

# ------------------------------------------------------------------ checks
# One start per runtime; each prints the versions of slurmtrain and torch the image's Python sees (from their
# metadata: importing torch would double a warm run's time; images.sh imports both once per build, and the tier's
# smoke test, tests/containers/test_runtimes.py, imports both in every runtime).
PROBE='import importlib.metadata as m; print(m.version("slurmtrain"), m.version("torch"))'
check() {
  local name=$1 t0 out
  shift
  t0=$EPOCHREALTIME
  out=$("$@" 2>&1) || { echo "$out" | tail -n 20 >&2; die "$name cannot start the image"; }
  log "$name: $(echo "$out" | tail -n 1) ($(python3 -c "print(f'{$EPOCHREALTIME - $t0:.2f}')") s)"
}
check podman podman run --rm localhost/slurmtrain-test python3 -c "$PROBE"
check ch-run env USER="${USER:-root}" ch-run "$STATE/images/slurmtrain" -- python3 -c "$PROBE"
check enroot enroot start --env USER="${USER:-root}" "$SQSH" python3 -c "$PROBE"
check pyxis srun -N1 -t 5 --container-image="$SQSH" python3 -c "$PROBE"
log "containers ready in $((SECONDS - t_start)) s (state in $STATE)"
