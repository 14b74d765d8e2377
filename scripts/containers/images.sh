#!/usr/bin/env bash
# Build the `containers` test tier's image once, and keep it between runs (called by scripts/containers/up.sh).
#
# No registry: the root filesystem comes from Debian's mirror (debootstrap --variant=minbase bookworm, Python 3.11),
# and the image IS the environment: torch $TORCH_SPEC (CPU) and slurmtrain with its runtime dependencies, at the
# version of this checkout (a non-editable copy of the committed tree, with the working tree's pyproject.toml), are
# installed into the image's own Python (/usr/lib/python3 + /usr/local/lib/python3.11/dist-packages), so `python3`
# and `python` in any runtime are the image's, whatever PATH the runtime passes in. One root filesystem, three forms:
#   $IMAGES/slurmtrain/        the directory, for Charliecloud (ch-run)
#   $IMAGES/slurmtrain.sqsh    SquashFS, for enroot and pyxis (srun --container-image)
#   localhost/slurmtrain-test  the Podman image (podman import of the same tree)
#   $IMAGES/images.json        the manifest: paths, the Python inside, slurmtrain's and torch's versions there, the
#                              source commit, the rebuild key, sizes and build times
#
# Rebuild key: sha256 of slurmtrain's version and runtime dependency list (pyproject.toml's [project]), the torch spec
# and this recipe's version; not the sources, the extras or the tool settings (a development run mounts the
# checkout's code over the image's copy). When the key matches and every output exists, nothing is built. Every build
# step is bounded by `ulimit -f` (one file at most 4 GiB), and a build refuses to start with less than $MIN_FREE_GB GB
# free.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${SLURMTRAIN_CONTAINERS_DIR:-/var/tmp/slurmtrain-containers}
IMAGES=$STATE/images
BUILD=$STATE/build
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
MIRROR=${SLURMTRAIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
MIN_FREE_GB=${SLURMTRAIN_CONTAINERS_MIN_FREE_GB:-10}
PODMAN_REF=${SLURMTRAIN_PODMAN_IMAGE:-localhost/slurmtrain-test}
RECIPE=3   # raise when the recipe below changes what the image holds
DIR_IMAGE=$IMAGES/slurmtrain
SQSH=$IMAGES/slurmtrain.sqsh
MANIFEST=$IMAGES/images.json
SITE=/usr/local/lib/python3.11/dist-packages
FSIZE_KB=4194304   # ulimit -f: no file of a build step may pass 4 GiB (a device node read as a file would fill the disk)

log() { echo "images.sh: $*"; }
die() { echo "images.sh: ERROR: $*" >&2; exit 1; }
declare -A TIMES=()
# step NAME CMD...: run one bounded build step (its output into $BUILD/NAME.log), print and keep its duration.
step() {
  local name=$1 t0=$SECONDS
  shift
  log "$name ..."
  if ! ( ulimit -f "$FSIZE_KB"; "$@" ) > "$BUILD/$name.log" 2>&1; then
    tail -n 20 "$BUILD/$name.log" >&2
    die "step '$name' failed (see $BUILD/$name.log)"
  fi
  TIMES[$name]=$((SECONDS - t0))
  log "$name: ${TIMES[$name]} s"
}

[[ $EUID -eq 0 ]] || die "must run as root (debootstrap, podman import)"
for b in debootstrap mksquashfs podman ch-run git sha256sum; do
  command -v "$b" >/dev/null || die "$b not found; run scripts/containers/install.sh first"
done

# The key: slurmtrain's version, Python requirement and runtime dependencies (pyproject.toml's [project] table, not its
# extras or tool settings), the torch spec and the recipe.
key=$("$PYTHON" - "$REPO/pyproject.toml" "$TORCH_SPEC" "$RECIPE" <<'PY'
import hashlib, json, sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
what = [project["version"], project.get("requires-python"), sorted(project.get("dependencies", [])), sys.argv[2], sys.argv[3]]
print(hashlib.sha256(json.dumps(what).encode()).hexdigest())
PY
) || die "cannot read $REPO/pyproject.toml"
# The Podman image's key lives beside the others, with the image's id (a re-imported or removed image does not match).
podman_id() { podman image inspect --format '{{.Id}}' "$PODMAN_REF" 2>/dev/null || true; }
dir_ok() { [[ "$(cat "$DIR_IMAGE.key" 2>/dev/null)" == "$key" && -x $DIR_IMAGE/usr/bin/python3 ]]; }
sqsh_ok() { [[ "$(cat "$SQSH.key" 2>/dev/null)" == "$key" && -s $SQSH ]]; }
podman_ok() { local id; id=$(podman_id); [[ -n $id && "$(cat "$IMAGES/podman.key" 2>/dev/null)" == "$key $id" ]]; }
up_to_date=0
if dir_ok && sqsh_ok && podman_ok && [[ -s $MANIFEST ]]; then
  up_to_date=1
  log "images up to date (key ${key:0:12}): $DIR_IMAGE, $SQSH, $PODMAN_REF"
fi

mkdir -p "$IMAGES" "$BUILD"
t_all=$SECONDS
rootfs=$BUILD/rootfs
strip_devices() { find "$1/dev" -mindepth 1 \( -type c -o -type b \) -delete 2>/dev/null || true; }

if ! dir_ok; then
  free_gb=$(df --output=avail -BG "$STATE" | tail -n 1 | tr -dc '0-9')
  ((free_gb >= MIN_FREE_GB)) || die "only ${free_gb} GB free under $STATE; the build needs $MIN_FREE_GB GB (set SLURMTRAIN_CONTAINERS_MIN_FREE_GB to lower the bar)"
  rm -rf "$rootfs"
  # minbase + Python 3.11 (python-is-python3: `python` too). torch's CPU wheel brings its own libgomp. The base system
  # is kept as a tarball (about 220 MB): a rebuild for a new version or dependency list starts from it, not the mirror.
  base=$BUILD/base-bookworm-r$RECIPE.tar
  if [[ -s $base ]]; then
    mkdir -p "$rootfs"
    step unpack-base tar -C "$rootfs" -xf "$base"
  else
    rm -f "$BUILD"/base-bookworm-r*.tar
    step debootstrap debootstrap --variant=minbase --include=python3,python-is-python3 bookworm "$rootfs" "$MIRROR"
    strip_devices "$rootfs"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    step save-base tar -C "$rootfs" -cf "$base.new" .
    mv "$base.new" "$base"
  fi
  # slurmtrain as the checkout has it committed, with the working tree's pyproject.toml (its version and dependencies):
  # a non-editable copy, built outside the shared working tree.
  src=$BUILD/src
  rm -rf "$src"
  mkdir -p "$src"
  if commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null); then
    git -C "$REPO" archive HEAD | tar -x -C "$src"
  else  # a checkout without git (an unpacked tarball): its packages as they are
    commit="none (no git repository at $REPO)"
    tar -C "$REPO" --exclude=__pycache__ -c pyproject.toml README.md contract launcher train hydra_plugins | tar -x -C "$src"
  fi
  cp "$REPO/pyproject.toml" "$src/pyproject.toml"
  # The image's Python is Debian's 3.11 (cp311, glibc 2.36): the host's pip installs the same wheels for it.
  step pip-install "$PYTHON" -m pip install -q --no-warn-script-location --target "$rootfs$SITE" \
    "$TORCH_SPEC" "$src"
  rm -rf "$src" "$rootfs$SITE/bin"   # console scripts with the host's interpreter in their #! line
  # The job's host names resolve inside the image too (enroot and podman bring the host's /etc/hosts; a runtime that
  # keeps the image's own needs these, or gloo must be told GLOO_SOCKET_IFNAME=lo).
  printf '127.0.0.1\tlocalhost %s n1 n2 n3\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' "$(hostname)" > "$rootfs/etc/hosts"
  echo "$commit" > "$rootfs/etc/slurmtrain-image-commit"
  # Swapped in with two renames (a run that uses the old tree meanwhile keeps it until then).
  rm -f "$DIR_IMAGE.key" "$SQSH.key"
  rm -rf "$DIR_IMAGE.old"
  [[ ! -e $DIR_IMAGE ]] || mv "$DIR_IMAGE" "$DIR_IMAGE.old"
  mv "$rootfs" "$DIR_IMAGE"
  rm -rf "$DIR_IMAGE.old"
  echo "$key" > "$DIR_IMAGE.key"
fi
strip_devices "$DIR_IMAGE"

if ! sqsh_ok; then
  rm -f "$SQSH.key" "$SQSH.new"   # the old .sqsh stays until the new one replaces it (mv)
  # zstd at a low level: a third of the tree's size, and unpacking (enroot create, pyxis) stays fast.
  step mksquashfs mksquashfs "$DIR_IMAGE" "$SQSH.new" -comp zstd -Xcompression-level 3 -noappend -no-progress \
    -quiet -processors "$(nproc)"
  mv "$SQSH.new" "$SQSH"
  echo "$key" > "$SQSH.key"
fi

if ! podman_ok; then
  rm -f "$IMAGES/podman.key"   # the import moves the name onto the new image; prune drops the old one
  import() {
    tar -C "$DIR_IMAGE" -c . | podman import -q \
      --change "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      --change "ENV=LANG=C.UTF-8" --change "LABEL=slurmtrain.key=$key" --change 'CMD=["/usr/bin/python3"]' \
      - "$PODMAN_REF"
  }
  step podman-import import
  echo "$key $(podman_id)" > "$IMAGES/podman.key"
  podman image prune -f > /dev/null 2>&1 || true
fi

# What the image holds, read from inside it once per build (ch-run on the directory: the fastest runtime here); an
# up-to-date image keeps what its manifest says, and only the manifest's notes are written again.
probe=""
if ((up_to_date == 0)); then
probe=$(USER=${USER:-root} ch-run --unset-env='*' --set-env=PATH=/usr/local/bin:/usr/bin:/bin "$DIR_IMAGE" -- \
  python3 -c 'import importlib.metadata as m, sys, torch; print(m.version("slurmtrain"), torch.__version__, sys.executable, "%d.%d.%d" % sys.version_info[:3])') ||
  die "the image's python cannot import torch and slurmtrain (ch-run $DIR_IMAGE)"
fi
read -r st_version torch_version py_exe py_version <<< "${probe:-- - - -}"
# Times of this run's steps (an up-to-date output keeps the times recorded when it was built).
times_json=$(for k in "${!TIMES[@]}"; do printf '"%s": %s\n' "$k" "${TIMES[$k]}"; done | paste -sd, -)
"$PYTHON" - "$MANIFEST" <<PY
import json, os, sys, time
path = sys.argv[1]
old = {}
if os.path.exists(path):
    try:
        old = json.load(open(path))
    except ValueError:
        pass
same = old.get("key") == "$key"
times = dict(old.get("build_seconds", {})) if same else {}
probed = {"slurmtrain_version": "$st_version", "torch_version": "$torch_version", "python": "$py_exe",
          "python_version": "$py_version"}
if "$probe" == "" and same:
    probed = {k: old[k] for k in probed}
times.update({${times_json}})
def size(p):
    total = 0
    for root, _, files in os.walk(p):
        for f in files:
            fp = os.path.join(root, f)
            if not os.path.islink(fp):
                total += os.lstat(fp).st_size
    return total
manifest = {
    "key": "$key",
    "recipe": $RECIPE,
    "source_commit": open("$DIR_IMAGE/etc/slurmtrain-image-commit").read().strip(),
    **probed,
    "site_packages": "$SITE",
    "images": {"directory": "$DIR_IMAGE", "squashfs": "$SQSH", "podman": "$PODMAN_REF"},
    "sizes_bytes": old["sizes_bytes"] if same and "$probe" == "" and "sizes_bytes" in old
                   else {"directory": size("$DIR_IMAGE"), "squashfs": os.path.getsize("$SQSH")},
    "notes": {
        "hosts": "ch-run, enroot/pyxis and podman (netns=host) each show the host's own /etc/hosts (ch-run binds it"
                 " over the image's file); the image's own names localhost, the build host ($(hostname)) and n1 n2 n3",
        "env": "podman and enroot start with the image's environment (PATH=/usr/local/sbin:...:/bin), not the"
               " caller's: pass variables with -e/--env; ch-run and pyxis (srun) pass the caller's in",
        "gloo": "if a runtime keeps an /etc/hosts without the node's name, set GLOO_SOCKET_IFNAME=lo",
        "charliecloud": "ch-run needs \$USER set, passes the host's environment in (PATH, PYTHONPATH too) unless"
                        " told --unset-env, and -b SRC:DST needs DST to exist in the image",
        "enroot": "enroot.conf puts runtime, data and cache under $STATE/enroot/{runtime,data,cache}/user-UID;"
                  " ENROOT_ROOTFS_WRITABLE=yes; \`enroot start IMAGE.sqsh\` mounts it with squashfuse (no unpacking)",
        "pyxis": "plugstack: required /usr/local/lib/slurm/spank_pyxis.so use_squashfuse=1 (a step without"
                 " --container-name mounts the .sqsh in place, seconds; a named container is unpacked once,"
                 " 1.6 GB, minutes on this machine) and pyxis's default container_scope=global (a named container,"
                 " enroot's pyxis_NAME, outlives its job: a requeued attempt reuses it; enroot remove deletes it)",
        "podman": "/etc/containers/containers.conf: runtime=runc, cgroupfs, file events, default ulimits"
                  " nofile=20000 nproc=32768, netns=host",
    },
    "built_at": old.get("built_at") if old.get("key") == "$key" else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "build_seconds": times,
}
tmp = path + ".new"
with open(tmp, "w") as f:
    json.dump(manifest, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
PY
((up_to_date)) || log "images ready in $((SECONDS - t_all)) s: slurmtrain $st_version, torch $torch_version, $py_exe ($py_version); manifest $MANIFEST"
