"""A replica group's place on SLURM (each group one task of a job array, launcher/run/replica_slurm.py): the
lighthouse's address, this start's launch, and whether it heals.

- The lighthouse's address is in RUN_DIR/lighthouse.json, written by whoever started it (a job of its own writes it
  once it runs): every rank waits for it.
- The launch (the start barrier's, contract/rundir/replicas.py) is the array's id and the step the group resumes
  from (its newest complete checkpoint, 0 at the first start): the groups of a whole-array resume, each stopped at the
  same step, meet there again and train on together, as an uninterrupted run would.
- A task that SLURM started again (SLURM_RESTART_COUNT > 0) heals when another group is alive and training: one whose
  Manager heartbeats to the lighthouse (its status page) and that is not waiting at the start barrier itself (a
  group of a whole-array resume that came first). Otherwise it resumes from its newest checkpoint. The group's rank 0
  decides and its ranks follow (one all-reduce).
- A lighthouse gone for good (its own job has left the queue, or it stays silent past LIGHTHOUSE_WAIT_S) ends the
  group in one line, as the environment's doing (contract/rundir/environment.py): never requeued, where a requeue
  would only fail again; the same command submits a new one. Checked as each task starts and when a quorum fails.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from contract.rundir import ckpt_layout as layout
from contract.rundir import replicas as contract
from contract.rundir.accounting import queue_state
from contract.rundir.environment import LIGHTHOUSE_GONE, EndedByEnvironment, Ending, resume_hint
from contract.rundir.replicas import live_groups
from train.observe.metrics import log

# How long a lighthouse that does not answer is waited for before it counts as gone: its keeper starts a dead one
# again at the same address within seconds (launcher/run/lighthouse_keeper.py looks every 5 s).
LIGHTHOUSE_WAIT_S = 60.0


def waiting_file(main_dir: Path, group: int) -> Path:
    """Present while the group's rank 0 waits at the start barrier (train/replicas/manager.py start_barrier)."""
    return Path(main_dir) / "replicas" / "waiting" / f"group_{group}"


def waiting_groups(main_dir: Path) -> set[int]:
    folder = Path(main_dir) / "replicas" / "waiting"
    return {int(p.name.split("_")[1]) for p in folder.glob("group_*")} if folder.is_dir() else set()


def slurm_array() -> tuple[str, int] | None:
    """(array id, restart count) of this SLURM array task; None outside one."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if not array or os.environ.get("SLURM_ARRAY_TASK_ID") is None:
        return None
    return array, int(os.environ.get("SLURM_RESTART_COUNT", "0"))


def lighthouse_address(main_dir: Path, timeout_s: float) -> str:
    """The lighthouse of this launch, from RUN_DIR/lighthouse.json (its own job may still be starting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = contract.read_lighthouse(main_dir)
        if found and found.get("address"):
            return str(found["address"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"no lighthouse within {timeout_s:.0f} s: {main_dir / contract.LIGHTHOUSE_FILE} was "
                               "not written (see its job's log in the run's slurm/ folder, lighthouse-JOB.out)")
        time.sleep(0.5)


JOB_ENDED, SILENT = 1, 2  # why a lighthouse is gone for good (lighthouse_gone)


def lighthouse_gone(main_dir: Path, wait_s: float = LIGHTHOUSE_WAIT_S) -> int:
    """0 while this launch's lighthouse answers, or once it answers again within `wait_s` (its keeper restarted it);
    otherwise why it is gone for good: JOB_ENDED, at once, when the job of its own it ran in has left the queue
    (cancelled, failed, its node lost: nothing starts it again), or SILENT after `wait_s`."""
    found = contract.read_lighthouse(main_dir) or {}
    address, job = str(found.get("address") or ""), found.get("job")
    deadline = time.monotonic() + wait_s
    while True:
        if address and live_groups(address) is not None:
            return 0
        if job and queue_state(str(job)) == "":
            return JOB_ENDED
        if time.monotonic() > deadline:
            return SILENT
        time.sleep(2.0)


def lighthouse_gone_error(main_dir: Path, group: int, why: int) -> EndedByEnvironment:
    """The one line a group ends with when its lighthouse is gone for good: not requeued (it would only fail again),
    and the way back, which submits a new lighthouse with the groups."""
    found = contract.read_lighthouse(main_dir) or {}
    words = (f"its job {found.get('job')} has ended" if why == JOB_ENDED
             else f"it has not answered for {LIGHTHOUSE_WAIT_S:.0f} s")
    hint = resume_hint(contract.group_dir(main_dir, group)).removeprefix("then ")
    return EndedByEnvironment(Ending(LIGHTHOUSE_GONE, (
        f"error: the lighthouse of the replica groups at {found.get('address', '?')} is gone ({words}) and the "
        f"groups can't meet without one: replica group {group} ends here, not requeued; {hint}, with a new "
        "lighthouse")))


def place_on_slurm(cfg: Any, env: Any, main_dir: Path, group: int, agree: Any) -> None:
    """Under a SLURM array: the environment a local launcher would have given this group's ranks (LIGHTHOUSE_ENV,
    LAUNCH_ENV, HEAL_ENV). `agree(values) -> values`: the group's ranks' largest of each (one all-reduce)."""
    found = slurm_array()
    if found is None or os.environ.get(contract.HEAL_ENV) is not None:
        return
    array, restarts = found
    address = lighthouse_address(main_dir, float(cfg.watchdog.startup_timeout_s))
    os.environ[contract.LIGHTHOUSE_ENV] = address if "://" in address else f"http://{address}"
    heal, gone, live = 0, 0, None
    if env.is_main:
        live = live_groups(address)
        if live is None:  # started again while it is, or gone for good
            gone = lighthouse_gone(main_dir)
            live = None if gone else live_groups(address)
    if env.is_main and restarts > 0 and not gone:
        others = sorted((live or set()) - {group} - waiting_groups(main_dir))
        heal = int(bool(others))
        # No live group: the newest checkpoint of any group is this group's (adopt_newest: one cut short in its own
        # save would make it train the steps since alone, into other weights); one at max_steps when another group
        # finished the run while this task waited in the queue: nothing to train again.
        newest = None if heal else contract.adopt_newest(main_dir, group, int(cfg.parallel.replica_groups))
        if heal:
            how = f"groups {others} are alive: healing from one (no checkpoint read)"
        elif newest is not None and newest[1] >= int(cfg.trainer.max_steps) and newest[0] != group:
            how = (f"group {newest[0]} finished the run meanwhile: its final checkpoint (step {newest[1]}) is this "
                   "group's; nothing to train again")
        else:
            how = "no other group is alive: resuming from the newest checkpoint" + (
                "" if newest is None or newest[0] == group else f" (group {newest[0]}'s, step {newest[1]})") + (
                "" if live is not None else " (the lighthouse's status could not be read)")
        log.info("replica group %d started again (restart %d): %s", group, restarts, how)
    heal, gone = agree([heal, gone])
    if gone:
        raise lighthouse_gone_error(main_dir, group, gone)
    # After the agreement: rank 0's adoption is on disk for every rank of the group.
    latest = layout.latest_complete_checkpoint(contract.group_dir(main_dir, group))
    os.environ[contract.LAUNCH_ENV] = f"{array}.s{latest.step if latest is not None else 0}"
    os.environ[contract.HEAL_ENV] = str(int(heal))
