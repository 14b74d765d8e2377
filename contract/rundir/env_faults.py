"""Test-only fault injection for failures from the environment (contract/rundir/environment.py tells them).

    SLURMTRAIN_TEST_DISK_FULL=WHAT:STEP     WHAT = checkpoint | metrics | events | verify_early (the early checkpoint
                                            check, step 1): that writer's write for step STEP
                                            fails as a full disk does (OSError ENOSPC naming the file)
    SLURMTRAIN_TEST_RUN_DIR=HOW:STEP        after step STEP rank 0 removes the run directory (moves it to
                                            RUN_DIR.moved-away, for the test to restore) or makes it read-only
                                            (HOW = remove | readonly: a read-only bind mount as root, where chmod
                                            does not stop writes; chmod -R a-w otherwise)
    SLURMTRAIN_TEST_MEMORY=HOW:RANK:STEP    in step STEP, RANK runs out of host memory: HOW = raise (MemoryError)
                                            or oom-kill (it moves itself into a memory cgroup capped at 64 MiB of
                                            new allocations and allocates until the kernel's OOM killer kills it; root)

Pure stdlib: contract/rundir/events.py calls the events hook.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

DISK_FULL_ENV = "SLURMTRAIN_TEST_DISK_FULL"
RUN_DIR_ENV = "SLURMTRAIN_TEST_RUN_DIR"
MEMORY_ENV = "SLURMTRAIN_TEST_MEMORY"
MOVED_AWAY = ".moved-away"
OOM_CGROUP_PREFIX = "slurmtrain-oom-test-"


def _spec(name: str) -> list[str]:
    value = os.environ.get(name, "")
    return value.split(":") if value else []


def disk_full(what: str, step: int | None, path: Path | str) -> None:
    """Raise ENOSPC for `path` when the test asked for this writer at this step."""
    spec = _spec(DISK_FULL_ENV)
    if spec and spec[0] == what and step is not None and int(spec[1]) == int(step):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def disk_full_in_checkpoint(path: Path) -> None:
    """The checkpoint hook: the step is in the file's directory name (checkpoints/step_N/...)."""
    match = re.search(r"step_(\d+)", str(path))
    if match:
        disk_full("checkpoint", int(match.group(1)), path)


def after_step(step: int, rank: int, run_dir: Path) -> None:
    """Called by every rank after each step."""
    run_spec = _spec(RUN_DIR_ENV)
    if run_spec and rank == 0 and int(run_spec[1]) == step:
        if run_spec[0] == "remove":
            os.rename(run_dir, f"{run_dir}{MOVED_AWAY}")
        else:
            make_read_only(run_dir)
    memory_spec = _spec(MEMORY_ENV)
    if memory_spec and int(memory_spec[1]) == rank and int(memory_spec[2]) == step:
        if memory_spec[0] == "raise":
            raise MemoryError()
        exhaust_memory_in_cgroup()


def make_read_only(run_dir: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(run_dir), str(run_dir)], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(run_dir)], check=True)
    else:
        for root, dirs, files in os.walk(run_dir):
            for name in dirs + files:
                os.chmod(Path(root) / name, 0o555 if name in dirs else 0o444)
        os.chmod(run_dir, 0o555)


def undo_read_only(run_dir: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["umount", str(run_dir)], check=True)
    else:
        for root, _dirs, files in os.walk(run_dir):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(Path(root) / name, 0o644)


def memory_cgroup() -> Path | None:
    """This process's memory cgroup directory, when it can make child groups there (root, usually)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        base = None
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").is_file():
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
        if base is not None and base.is_dir() and os.access(base, os.W_OK):
            return base
    return None


def exhaust_memory_in_cgroup() -> None:
    base = memory_cgroup()
    if base is None:
        raise RuntimeError(f"{MEMORY_ENV}=oom-kill needs a writable memory cgroup (root)")
    group = base / f"{OOM_CGROUP_PREFIX}{os.getpid()}"
    group.mkdir()
    # Charges stay with the old group when a process moves: the new one counts only what is allocated from now on.
    cap = str(64 * 2**20)
    if (group / "memory.limit_in_bytes").exists():  # cgroup v1
        (group / "memory.limit_in_bytes").write_text(cap)
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(cap)
    else:
        (group / "memory.max").write_text(cap)
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
    (group / "cgroup.procs").write_text(str(os.getpid()))
    hoard = []
    while True:  # until the kernel kills this process
        hoard.append(bytearray(16 * 2**20))


def remove_oom_cgroups() -> None:
    """For the tests: remove the (empty, once their process is dead) groups exhaust_memory_in_cgroup made."""
    base = memory_cgroup()
    if base is not None:
        for group in base.glob(f"{OOM_CGROUP_PREFIX}*"):
            try:
                group.rmdir()
            except OSError:
                pass  # its process still runs
