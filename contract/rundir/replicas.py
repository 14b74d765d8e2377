"""Replica groups (parallel.replica_groups, docs/faults.md): what the launcher and the ranks agree on. Pure stdlib.

- The environment the launcher gives each group's ranks (GROUP_ENV, GROUPS_ENV, HEAL_ENV, LAUNCH_ENV; torchft's
  own TORCHFT_LIGHTHOUSE); on SLURM the array task's batch shell sets GROUP_ENV and GROUPS_ENV, and the ranks
  derive the rest (train/replicas/peers.py).
- RUN_DIR/lighthouse.json: where the lighthouse listens ("address": host:port), who started it ("launcher",
  "login", "job" or "user") and when; on SLURM the groups wait for it at start.
- Group k > 0 keeps its own run directory, RUN_DIR/replicas/group_k (its logs, metrics, checkpoints); group 0's is
  RUN_DIR itself.
- The ledger, in RUN_DIR/events.jsonl, lines within an attempt (contract/rundir/events.py WITHIN_ATTEMPT):
    {"kind": "replica_lost", "time", "step": first step trained without them, "groups": [k, ...]}
    {"kind": "replica_rejoined", "time", "groups", "lost_step", "rejoined_step", "reduced_steps": N,
     "seen": epoch, "heal_s": seconds from seen to the first full step, "missed_samples": [[start, end), ...]}
  written by the lowest-numbered group that trained through the loss. A run that ends before the groups
  rejoin gets the rejoined line with "rejoined_step": null at its end.
    {"kind": "replica_sync_discarded", "time", "group": k, "steps": [first, last], "missed_samples": [...]}
  optim.outer=diloco: a sync whose commit vote failed; group k's samples of those steps were not trained.
    {"kind": "replica_left", "time", "group": k, "step": N, "signal": "SIGTERM" | "SIGUSR1", "requeue": bool,
     "waited_s": seconds, "groups_on": [j, ...]}
  group k stopped alone after step N with a checkpoint (a signal reached only it, train/replicas/stops.py) and left
  the quorum; the groups_on trained on (their replica_lost line follows, from step N + 1).
    {"kind": "replica_restarting", "time", "group": k, "launcher_pid": pid, "host"}
  in the group's own run directory: a local launcher starts the lost group k again (`restarting`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from contract.rundir import ckpt_layout as layout
from contract.rundir.events import WITHIN_ATTEMPT

GROUP_ENV = "SLURMTRAIN_REPLICA_GROUP"
GROUPS_ENV = "SLURMTRAIN_REPLICA_GROUPS"
# Set on a group the launcher restarted while another group lives: it heals from a live peer, reads no checkpoint.
HEAL_ENV = "SLURMTRAIN_REPLICA_HEAL"
# One value per launch (local: the launcher's; SLURM: the array job): the start barrier's files are this launch's.
LAUNCH_ENV = "SLURMTRAIN_REPLICA_LAUNCH"
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
# SLURM: when the group's array task started (epoch seconds, set by its batch shell), for the end it records.
TASK_STARTED_ENV = "SLURMTRAIN_REPLICA_TASK_STARTED"
LIGHTHOUSE_FILE = "lighthouse.json"
LOST, REJOINED, DISCARDED, LEFT = "replica_lost", "replica_rejoined", "replica_sync_discarded", "replica_left"
# A local launcher about to start a lost group again (launcher/run/replica_groups.py): the group's run directory gets
# {"kind": RESTARTING, "launcher_pid", "host"} right after its attempt's end, so that status reads the group as
# running, not crashed, while its launcher lives and the new attempt has not started yet.
RESTARTING = "replica_restarting"
# A group started to heal found no live peer ahead of it (every group was lost): it exits with this, and the
# launcher starts it again from the checkpoint instead (never silently from step 0).
EXIT_NO_PEER = 73
# A local group that stopped alone (a signal reached only it) exits with this: its launcher starts it again to heal,
# as a lost group (launcher/run/replica_groups.py). Under SLURM its task ends as for any stop (requeued for USR1).
EXIT_LEFT = 77


def group_dir(run_dir: Path, group: int) -> Path:
    return Path(run_dir) if group == 0 else Path(run_dir) / "replicas" / f"group_{group}"


def adopt_finished(run_dir: Path, group: int, groups: int, max_steps: int) -> int | None:
    """A group started again with no live group to heal from, after another group finished the run: that group's
    final checkpoint is this group's too (adopt_newest), so that it resumes at the end and trains nothing again
    alone, and its directory (RUN_DIR itself for group 0: what export and sample read) holds the run's final
    weights. Returns the group it came from, or None."""
    found = adopt_newest(run_dir, group, groups, at_least=max_steps)
    return found[0] if found is not None else None


def adopt_newest(run_dir: Path, group: int, groups: int, at_least: int = 0) -> tuple[int, int] | None:
    """A group about to start from a checkpoint (no live group to heal from): the newest complete checkpoint of any
    group, at step `at_least` or later, linked into this group's checkpoints when it is newer than this group's own.
    Every group holds the same weights and optimizer state at a committed step, but their newest checkpoints can
    differ (a group lost while saving one). From an older one of its own, a group would train the steps between
    alone and meet the others at the same step count with other weights, and torchft heals only a group that is
    behind: the groups would never be equal again. Returns (group it came from, step) when this group resumes
    from a step at least `at_least` (its own checkpoint: its own number), else None. Hard links: nothing is
    copied, and a later save at that step replaces the files, never rewrites them."""
    own = group_dir(run_dir, group)
    mine = layout.latest_complete_checkpoint(own)
    best: tuple[int, Any] | None = None
    for g in range(groups):
        theirs = layout.latest_complete_checkpoint(group_dir(run_dir, g)) if g != group else None
        if theirs is not None and theirs.step >= at_least and (best is None or theirs.step > best[1].step):
            best = (g, theirs)
    if best is None or (mine is not None and mine.step >= best[1].step):
        if mine is None or mine.step < at_least:
            return None
        return (best[0] if best is not None and best[1].step == mine.step else group), mine.step  # taken before
    g, theirs = best
    target = layout.step_dir(own, theirs.step)
    partial = target.with_name(f".{target.name}.from_group_{g}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        shutil.copytree(theirs.path, partial, copy_function=_link_or_copy)
    except OSError:  # removed meanwhile (a live group's retention): this group's own newest, as before
        shutil.rmtree(partial, ignore_errors=True)
        return (group, mine.step) if mine is not None and mine.step >= at_least else None
    shutil.rmtree(target, ignore_errors=True)  # an incomplete one of this group's own
    partial.rename(target)
    return g, theirs.step


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a filesystem without hard links
        shutil.copy2(src, dst)


# torchft 0.2.0's lighthouse status page (GET /status): one <li class="heartbeat [old]"> per replica it heard from;
# "old" once its heartbeat timed out. Its replica ids are ours: group_K:uuid (train/replicas/manager.py).
_HEARTBEAT = re.compile(r'<li class="heartbeat\s*(old)?\s*">\s*group_(\d+):')


def live_groups(address: str, timeout_s: float = 5.0) -> set[int] | None:
    """The groups whose Managers heartbeat to the lighthouse now; None when it could not be asked."""
    url = (address if "://" in address else f"http://{address}") + "/status"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - the run's own lighthouse
            page = response.read().decode(errors="replace")
    except OSError:
        return None
    return {int(group) for old, group in _HEARTBEAT.findall(page) if not old}


def ready_file(run_dir: Path, launch: str, group: int) -> Path:
    """The start barrier: each group's rank 0 touches this once its Manager heartbeats to the lighthouse."""
    return Path(run_dir) / "replicas" / "ready" / launch / f"group_{group}"


def write_lighthouse(run_dir: Path, address: str, host: str, pid: int | None, started_by: str) -> None:
    path = Path(run_dir) / LIGHTHOUSE_FILE
    tmp = path.with_name(f".{LIGHTHOUSE_FILE}.tmp")
    job = os.environ.get("SLURM_JOB_ID") if started_by == "job" else None  # a job of its own: which (peers.py)
    tmp.write_text(json.dumps({"address": address, "host": host, "pid": pid, "started_by": started_by, "job": job,
                               "time": time.time()}) + "\n")
    tmp.replace(path)


def read_lighthouse(run_dir: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((Path(run_dir) / LIGHTHOUSE_FILE).read_text()))
    except (OSError, ValueError):
        return None


def group_samples(position: int, group: int, groups: int, group_dp: int, micro: int, accum: int) -> list[list[int]]:
    """The global sample ranges [start, end) group `group` reads in the step whose first sample is `position`
    (train/data/batches.py micro_batch_indices: dp_rank = group x group_dp + its rank in the group)."""
    dp_size = groups * group_dp
    out: list[list[int]] = []
    for micro_step in range(accum):
        start = position + (micro_step * dp_size + group * group_dp) * micro
        out.append([start, start + group_dp * micro])
    return out


def merge_ranges(ranges: list[list[int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def failures(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rejoined lines: one per loss of groups, with what it cost."""
    return [e for e in events if e.get("kind") == REJOINED]


def group_goodput(events: list[dict[str, Any]], groups: int, steps: int) -> float | None:
    """The share of the group-steps the run could have trained that it did: a lost group's reduced steps count as
    lost, once per missing group. None without steps."""
    if groups <= 1 or steps <= 0:
        return None
    lost = sum(int(e.get("reduced_steps", 0)) * len(e.get("groups", [])) for e in failures(events))
    return max(0.0, 1.0 - lost / (groups * steps))


def failure_lines(events: list[dict[str, Any]], groups: int = 1, steps: int = 0) -> list[str]:
    """status / report: one line per loss of replica groups, then the run's share of group-steps trained."""
    lines = []
    # A group that stopped alone after step N left the quorum from step N + 1: its loss says why.
    left: dict[tuple[Any, Any], dict[str, Any]] = {
        (e.get("group"), int(e["step"]) + 1): e for e in events if e.get("kind") == LEFT and "step" in e}
    for e in failures(events):
        why = "".join(f" (group {g} stopped alone: {left[g, e.get('lost_step')].get('signal')} reached only it)"
                      for g in e.get("groups", []) if (g, e.get("lost_step")) in left)
        missed = sum(end - start for start, end in e.get("missed_samples", []))
        when = time.strftime("%H:%M:%S", time.localtime(float(e.get("seen", e["time"]))))
        rejoined = (f"rejoined at step {e['rejoined_step']} after {float(e['heal_s']):.1f} s"
                    if e.get("rejoined_step") is not None else "never rejoined")
        reduced = int(e.get("reduced_steps", 0))
        trained = (f" ({groups - len(e.get('groups', []))} of {groups} groups trained steps {e.get('lost_step')}-"
                   f"{int(e.get('lost_step') or 0) + reduced - 1})" if groups > 1 and reduced else "")
        lines.append(f"replica group(s) {', '.join(map(str, e.get('groups', [])))} lost at step {e.get('lost_step')}{why} "
                     f"(seen {when}), {rejoined}; {reduced} step(s) at reduced size{trained}, "
                     f"{missed} sample(s) not trained")
    share = group_goodput(events, groups, steps)
    if lines and share is not None:
        lines.append(f"replica groups trained {share:.1%} of the {groups} x {steps} group-steps (the rest were lost "
                     "groups' shares)")
    return lines


def restarting(events: list[dict[str, Any]], host: str, alive: Any) -> bool:
    """Whether a local launcher is starting this run directory's group again: a RESTARTING line after the newest
    attempt's end, written on `host` by a launcher that `alive(pid)` says still runs."""
    ends = [i for i, e in enumerate(events) if e.get("kind") not in WITHIN_ATTEMPT]
    after = events[ends[-1] + 1:] if ends else events
    marks = [e for e in after if e.get("kind") == RESTARTING]
    if not marks:
        return False
    pid = marks[-1].get("launcher_pid")
    return marks[-1].get("host") == host and isinstance(pid, int) and bool(alive(pid))
