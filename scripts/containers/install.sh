#!/usr/bin/env bash
# Install the container runtimes of the `containers` test tier (scripts/containers/up.sh puts them to work):
#   Charliecloud 0.31 and Podman 4.3 (with runc: crun fails here) from Debian 12, and enroot 4.1.2 and pyxis 0.24.0
#   built from the source tarball $SLURMTRAIN_CONTAINERS_SRC (default /work/shared/containers/enroot-pyxis-src.tar.gz;
#   NVIDIA/enroot v4.1.2 with its submodules and NVIDIA/pyxis v0.24.0, Apache-2.0).
#
# Idempotent and non-interactive, like scripts/slurm/install.sh: when every package is installed and the built
# enroot/pyxis match the tarball's stamp (its sha256), it does nothing (no apt-get update, no network, no build).
#   enroot  -> /usr/local (bin/enroot, lib/enroot, etc/enroot, share/enroot)
#   pyxis   -> /usr/local/lib/slurm/spank_pyxis.so (up.sh names it in the SLURM cluster's plugstack.conf)
#   stamps  -> $SLURMTRAIN_CONTAINERS_DIR/build (default /var/tmp/slurmtrain-containers/build)
set -euo pipefail

SRC=${SLURMTRAIN_CONTAINERS_SRC:-/work/shared/containers/enroot-pyxis-src.tar.gz}
STATE=${SLURMTRAIN_CONTAINERS_DIR:-/var/tmp/slurmtrain-containers}
BUILD=$STATE/build
PREFIX=/usr/local
PYXIS_SO=$PREFIX/lib/slurm/spank_pyxis.so

PKGS=(
  charliecloud-runtime  # ch-run: runs a directory image
  squashfs-tools        # mksquashfs/unsquashfs: the .sqsh image of enroot and pyxis
  podman runc           # Podman with runc (crun: "cgroups in hybrid mode not supported" here)
  debootstrap           # the test image's root filesystem, from the apt mirror (no registry)
  # enroot: build (libtool automake libmd-dev; gcc/make from build-essential) and run (the rest)
  build-essential libtool automake libmd-dev libcap2-bin
  curl gawk jq parallel pigz zstd fuse-overlayfs squashfuse makeself
  libslurm-dev          # pyxis builds against the cluster's own SLURM 22.05 headers
)

log() { echo "install.sh: $*"; }
die() { echo "install.sh: ERROR: $*" >&2; exit 1; }
[[ $EUID -eq 0 ]] || die "must run as root (apt-get, make install into $PREFIX)"

missing=()
for p in "${PKGS[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]]; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "container runtime packages already installed"
else
  log "installing ${missing[*]}"
  source "$(dirname "${BASH_SOURCE[0]}")/../apt_install.sh"
  apt_install charliecloud-runtime "${missing[@]}"
fi

# ------------------------------------------------------------ enroot + pyxis
# The stamp is the tarball's digest: a new tarball rebuilds both, the same one skips the build.
[[ -r $SRC ]] || die "no source tarball at $SRC (set SLURMTRAIN_CONTAINERS_SRC)"
mkdir -p "$BUILD"
stamp=$(sha256sum "$SRC" | cut -d' ' -f1)
if [[ "$(cat "$BUILD/enroot-pyxis.stamp" 2>/dev/null)" == "$stamp" && -x $PREFIX/bin/enroot && -f $PYXIS_SO ]]; then
  log "enroot $($PREFIX/bin/enroot version) and pyxis already built from this tarball"
  exit 0
fi
t0=$SECONDS
work=$BUILD/src
rm -rf "$work"
mkdir -p "$work"
tar -C "$work" -xzf "$SRC"
[[ -d $work/enroot && -d $work/pyxis ]] || die "$SRC holds no enroot/ and pyxis/ directories"
jobs=$(nproc)
log "building enroot (make -j$jobs)"
( ulimit -f 4194304; make -C "$work/enroot" -j"$jobs" > "$BUILD/enroot-build.log" 2>&1 &&
  make -C "$work/enroot" install prefix="$PREFIX" >> "$BUILD/enroot-build.log" 2>&1 ) ||
  { tail -n 30 "$BUILD/enroot-build.log" >&2; die "enroot build failed (see $BUILD/enroot-build.log)"; }
# enroot-aufs2ovlfs/mksquashovlfs need capabilities to import as a non-root user (the upstream `make setcap`).
make -C "$work/enroot" setcap prefix="$PREFIX" >> "$BUILD/enroot-build.log" 2>&1 || log "warning: enroot setcap failed (only non-root imports need it)"
log "building pyxis"
( ulimit -f 4194304; make -C "$work/pyxis" -j"$jobs" > "$BUILD/pyxis-build.log" 2>&1 &&
  make -C "$work/pyxis" install prefix="$PREFIX" >> "$BUILD/pyxis-build.log" 2>&1 ) ||
  { tail -n 30 "$BUILD/pyxis-build.log" >&2; die "pyxis build failed (see $BUILD/pyxis-build.log)"; }
[[ -f $PYXIS_SO ]] || die "pyxis installed no $PYXIS_SO"
rm -rf "$work"
echo "$stamp" > "$BUILD/enroot-pyxis.stamp"
log "enroot $($PREFIX/bin/enroot version) and pyxis 0.24.0 built and installed in $((SECONDS - t0)) s"
