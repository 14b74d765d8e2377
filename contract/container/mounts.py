"""What a container must see of the host: the mounts slurmtrain adds by itself and the user's container.mounts.

Every path is mounted at its own path, so that config.yaml's absolute paths (made absolute at launch:
launcher/plan/paths.py) mean the same inside the container. The automatic mounts are settled once at launch
(launcher/checks/containers.py) and kept in config.yaml as container.auto_mounts, so that what the ranks render
later (an evaluation job's script) mounts the same.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

# The directory holding launcher/, train/ and contract/ of the slurmtrain this process runs: a source checkout when
# it has a pyproject.toml (an installed wheel's is site-packages, which is never mounted).
CODE_ROOT = Path(__file__).resolve().parents[2]


CHARLIECLOUD_CHECKOUT = "/mnt"


def source_checkout() -> Path | None:
    """This slurmtrain's source checkout, None for an installed copy."""
    return CODE_ROOT if (CODE_ROOT / "pyproject.toml").is_file() and (CODE_ROOT / "launcher").is_dir() else None


@dataclass(frozen=True)
class Mount:
    src: str
    dst: str
    read_only: bool = False

    @classmethod
    def parse(cls, text: str) -> Mount:
        """SRC:DST, SRC:DST:ro or SRC (at its own path). Raises ValueError naming the form."""
        parts = str(text).split(":")
        if len(parts) == 3 and parts[2] in ("ro", "rw"):
            src, dst, mode = parts
        elif len(parts) in (1, 2):
            src, dst, mode = parts[0], parts[-1], "rw"
        else:
            raise ValueError(f"container.mounts entry {text!r} is not SRC:DST or SRC:DST:ro")
        if not src or not dst or not os.path.isabs(dst):
            raise ValueError(f"container.mounts entry {text!r}: SRC and an absolute DST are both needed")
        return cls(os.path.normpath(os.path.expanduser(src)), os.path.normpath(dst), mode == "ro")

    def text(self) -> str:
        return f"{self.src}:{self.dst}" + (":ro" if self.read_only else "")


def mount_root(path: str) -> str:
    """The directory to mount for a path the config names: a glob's fixed part, a file's directory, the nearest
    existing directory of a path the run will create."""
    fixed = path
    if glob.has_magic(path):
        fixed = path[: min(path.index(c) for c in "*?[" if c in path)]
        fixed = fixed if fixed.endswith("/") else os.path.dirname(fixed)
    p = Path(os.path.normpath(fixed or "/"))
    while not p.is_dir() and p != p.parent:
        p = p.parent
    return str(p)


def outermost(paths: list[str]) -> list[str]:
    """The paths none of whose ancestors is in the list, in first-seen order, without repeats; `/` is dropped (a
    container that mounts the host's root has no image)."""
    out: list[str] = []
    for path in dict.fromkeys(os.path.normpath(p) for p in paths):
        if path == "/" or any(path == o or path.startswith(o.rstrip("/") + "/") for o in out):
            continue
        out = [o for o in out if not o.startswith(path.rstrip("/") + "/")] + [path]
    return out


def automatic(run_root: str, workdir: str, path_values: list[str]) -> list[str]:
    """The host directories a run reads and writes: its run root, its data and weights paths, and the directory it
    is launched from (the project's code and conf/)."""
    return outermost([mount_root(run_root), mount_root(workdir), *(mount_root(p) for p in path_values if p)])


def checkout_mount(checkout: str, runtime: str, auto: list[str]) -> Mount | None:
    """Where this slurmtrain's checkout is mounted over the image's copy (PYTHONPATH points there): at its own path,
    unless an automatic mount covers it already (None); Charliecloud's at /mnt, which its images have (ch-run binds
    only onto existing directories, and the checkout's own path is rarely one)."""
    if runtime == "charliecloud":
        return Mount(checkout, CHARLIECLOUD_CHECKOUT)
    if any(checkout == a or checkout.startswith(a.rstrip("/") + "/") for a in auto):
        return None
    return Mount(checkout, checkout)


def all_mounts(auto: list[str], user: list[str]) -> list[Mount]:
    """The automatic mounts (each at its own path), then the user's; a user's mount over the same destination
    wins."""
    users = [Mount.parse(m) for m in user]
    taken = {m.dst for m in users}
    return [Mount(p, p) for p in auto if p not in taken] + users
