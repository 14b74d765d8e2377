"""Replica groups through the failures that a plain lost group does not cover (issue 47's other cases; docs/faults.md):
a frozen rank (SIGSTOP: alive, holding its sockets, never answering), two groups lost at the same step, and a DiLoCo
group that is lost and heals at a sync. Local groups over gloo (torchft 0.2.0), as tests/dist/test_replica_groups.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from contract.rundir.events import read_events
from tests.conftest import ROOT, hq, launcher_env, read_metrics
from tests.dist.test_replica_groups import (
    COMMON,
    FAST,
    _digests,
    _wait_for,
    check_ledger,
    group_dir,
    weights,
)

pytest.importorskip("torchft")
pytestmark = [pytest.mark.dist, pytest.mark.xdist_group("replica_groups")]


def _pid(run_dir: Path, group: int, rank: int) -> int:
    """The pid of a group's rank in its current attempt (its log is appended to across restarts)."""
    text = (group_dir(run_dir, group) / "logs" / f"rank_{rank}.log").read_text()
    return int([line for line in text.splitlines() if "joined via local" in line][-1].rsplit("pid ", 1)[1])


def _healed_at(run_dir: Path, group: int) -> int:
    """The step at which the group's last attempt healed from a live group (it read no checkpoint)."""
    text = (group_dir(run_dir, group) / "logs" / "rank_0.log").read_text()
    last = text[text.rindex("joined via local"):]
    assert "resumed from" not in last and "healed from a live group at step " in last, last[-3000:]
    return int(last.split("healed from a live group at step ")[1].split()[0])


def _dead(pid: int) -> bool:
    """The process is gone or a zombie (killed, not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def _healed(run_dir: Path, group: int) -> bool:
    text = (group_dir(run_dir, group) / "logs" / "rank_0.log").read_text()
    return "healed from a live group at step " in text[text.rindex("joined via local"):]


def test_two_groups_lost_at_once_then_a_frozen_rank(run_root: Path, tmp_path: Path) -> None:
    """4 groups of 2 fsdp ranks. At step 10 rank 0 of group 2 and rank 1 of group 3 are killed; once both have
    healed from a live group, rank 1 of group 1 is frozen (SIGSTOP: alive, its sockets open, never answering). Group 0
    trains on throughout; group 1 is ended by its live rank 0 (its commit vote times out waiting for the frozen one, or
    its watchdog fires in the group's own collective), torn down, and heals; the run ends whole with every group's
    weights equal and the ledger exact."""
    steps, inject_at, groups, per_group = 500, 10, 4, 2
    trace = tmp_path / "digests"
    trace.mkdir()
    run_dir = run_root / "faults"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *COMMON, *FAST, "strategy=fsdp", f"trainer.max_steps={steps}",
         f"local.nproc={per_group * groups}", f"parallel.replica_groups={groups}", "trainer.ckpt_every=100",
         "watchdog.step_timeout_s=45", f"run.root={hq(run_root)}", "run.name=faults"],
        cwd=ROOT, env=launcher_env(SLURMTRAIN_TRACE_REPLICAS=str(trace)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    frozen = None
    try:
        _wait_for(f"group 3 at step {inject_at}", lambda: len(_digests(trace, 3)) >= inject_at, proc=proc)
        victims = {(2, 0): _pid(run_dir, 2, 0), (3, 1): _pid(run_dir, 3, 1)}
        for pid in victims.values():
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        for pid in victims.values():  # dead (a zombie until its launcher reaps it): its trace is final until it heals
            _wait_for(f"pid {pid} dead", lambda pid=pid: _dead(pid), proc=proc)
        # The steps the killed ranks had done as they started their last step. Group 0's own trace is no measure of
        # when they were killed: under load it lags the others by a step or two when read.
        kill_steps = {max(_digests(trace, g, r)) for g, r in victims}
        at = min(kill_steps)
        _wait_for("groups 2 and 3 healed", lambda: _healed(run_dir, 2) and _healed(run_dir, 3), proc=proc)
        # A few steps of all four first: the loss of groups 2 and 3 is closed before group 1 is lost (the other order,
        # the writer of an open loss lost, is tests/unit/test_replica_ledger.py's).
        back = max(_healed_at(run_dir, 2), _healed_at(run_dir, 3))
        # (the newest step, not the count: a healed group's trace lacks the steps it missed, and when its start-up
        # took long under load the count lagged by those, so that once group 1 was frozen only as the run ended)
        _wait_for("a step of every group", lambda: all(max(_digests(trace, g), default=-1) > back + 3
                                                       for g in range(groups)), proc=proc)
        frozen = _pid(run_dir, 1, 1)
        os.kill(frozen, signal.SIGSTOP)
        frozen_at, froze = max(_digests(trace, 0)), time.monotonic()
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
        if frozen is not None and Path(f"/proc/{frozen}").exists():
            os.kill(frozen, signal.SIGKILL)
    took = time.monotonic() - started
    assert proc.returncode == 0, err[-4000:]
    assert frozen is not None and not Path(f"/proc/{frozen}").exists()  # the frozen rank was ended with its group
    for g in (1, 2, 3):
        assert f"replica group {g} lost" in err, err[-4000:]
    assert "no group is alive" not in err, err[-4000:]  # every lost group was started again to heal
    # Groups 1-3 healed from a live group (group 0 trained through), their weights then group 0's bit for bit.
    healed = {g: _healed_at(run_dir, g) for g in (1, 2, 3)}
    # (at - 1: a kill inside an all-reduce that some groups finished leaves another group a step behind, which heals.)
    assert at - 1 <= healed[2] < frozen_at and at - 1 <= healed[3] < frozen_at and frozen_at <= healed[1] < steps, healed
    for g, step in healed.items():
        for rank in range(per_group):
            assert _digests(trace, g, rank)[step] == _digests(trace, 0, rank)[step], (g, rank, step)
    # Group 0 never stopped: its longest step gap is within the quorum timeout and a step.
    times = [r["time"] for r in read_metrics(run_dir)]
    gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    assert gap < 30 + 1, gap
    final = [weights(group_dir(run_dir, g) / "checkpoints" / f"step_{steps}", tmp_path) for g in range(groups)]
    for name, value in final[0].items():
        assert all(torch.equal(final[g][name], value) for g in range(1, groups)), name
    # The ledger: the samples each group did not train, named exactly once (check_ledger), whichever group wrote them.
    missed = check_ledger(run_dir, steps, groups, per_group)
    # Group 0 missed the kill step at most (fallen behind there); a killed group back before the survivors went on
    # missed nothing.
    # (A trace's step is the steps done as a step starts: a rank whose last line is k was training logged step k + 1,
    # or was in step k + 2's quorum, or, killed in an all-reduce it had finished, left others in step k's.)
    assert missed[0] <= set(range(min(kill_steps), max(kill_steps) + 3)) and missed[1], (missed, kill_steps)
    # Every group healed from a live one: no end recorded for it counts a step as trained again (a rank that raised
    # or hung counted those since its checkpoint).
    ends = [e for g in range(groups) for e in read_events(group_dir(run_dir, g)) if e["kind"] in ("crashed", "hung")]
    assert ends and all(e["steps_lost"] == 0 for e in ends), ends
    print(f"launch {took:.0f} s (kills at steps {sorted(kill_steps)}, {killed - started:.0f} s in; freeze at step {frozen_at}, "
          f"{froze - started:.0f} s in); group 0's longest step gap {gap:.1f} s; healed at {healed}; "
          f"steps missed {missed}")


def test_a_frozen_rank_of_one_of_two_groups_does_not_hold_the_other(run_root: Path, tmp_path: Path) -> None:
    """2 groups of 2 fsdp ranks; rank 1 of group 1 is frozen (SIGSTOP) while its rank 0 lives and heartbeats. With
    two groups the lighthouse has no majority without it, so before train/replicas/liveness.py the survivor made no
    step for 100 s. Now group 1's live rank sees its peer give no sign of life for parallel.replica_peer_timeout_s
    and ends the group: group 0 trains on after a pause well under its own timeouts, group 1 heals from it, and the
    run ends with both groups' weights equal."""
    steps, groups, per_group, peer_timeout = 300, 2, 2, 5
    trace = tmp_path / "digests"
    trace.mkdir()
    run_dir = run_root / "frozen2"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *COMMON, *FAST, "strategy=fsdp", f"trainer.max_steps={steps}",
         f"local.nproc={per_group * groups}", f"parallel.replica_groups={groups}", "trainer.ckpt_every=100",
         f"parallel.replica_peer_timeout_s={peer_timeout}", f"run.root={hq(run_root)}", "run.name=frozen2"],
        cwd=ROOT, env=launcher_env(SLURMTRAIN_TRACE_REPLICAS=str(trace)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    frozen = None
    try:
        _wait_for("both groups past step 10", lambda: all(len(_digests(trace, g)) > 10 for g in range(groups)),
                  proc=proc)
        frozen = _pid(run_dir, 1, 1)
        os.kill(frozen, signal.SIGSTOP)
        frozen_at = max(_digests(trace, 0))
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
        if frozen is not None and Path(f"/proc/{frozen}").exists():
            os.kill(frozen, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    assert frozen is not None and not Path(f"/proc/{frozen}").exists()  # ended with its group
    assert "replica group 1 lost" in err and "replica group 0 lost" not in err, err[-4000:]
    assert "no group is alive" not in err, err[-4000:]
    log = (group_dir(run_dir, 1) / "logs" / "rank_0.log").read_text()
    assert "its rank 1 has given no sign of life" in log, log[-3000:]
    healed = _healed_at(run_dir, 1)
    assert frozen_at <= healed < steps, (frozen_at, healed)
    for rank in range(per_group):
        assert _digests(trace, 1, rank)[healed] == _digests(trace, 0, rank)[healed], rank
    # Group 0 never stopped for long: the peer timeout, the teardown and a quorum, not its 10 s collective timeout
    # plus a 30 s quorum timeout (or the 100 s it waited before).
    times = [r["time"] for r in read_metrics(run_dir)]
    gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    assert gap < peer_timeout + 10 + 5, gap
    final = [weights(group_dir(run_dir, g) / "checkpoints" / f"step_{steps}", tmp_path) for g in range(groups)]
    for name, value in final[0].items():
        assert torch.equal(final[1][name], value), name
    print(f"frozen at step {frozen_at}; group 1 healed at {healed}; group 0's longest step gap {gap:.1f} s")


def test_a_lost_diloco_group_heals_at_a_sync(run_root: Path, tmp_path: Path) -> None:
    """optim.outer=diloco, 2 groups of 1 rank, a sync every 5 steps: group 1's rank is killed inside an interval.
    Group 0 trains on, its next sync without group 1; group 1 is started again and heals at a sync from group 0 (its
    weights, global weights and outer momentum), after which both hold the same weights, to the end. The ledger names
    group 1's share of every interval it did not take part in."""
    steps, every, kill_at = 500, 5, 12
    trace = tmp_path / "digests"
    trace.mkdir()
    run_dir = run_root / "diloco_heal"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *COMMON, *FAST, "strategy=ddp", "local.nproc=2", "parallel.replica_groups=2",
         "trainer.ckpt_every=0", "optim.outer=diloco", f"optim.sync_every={every}", "optim.outer_lr=0.7",
         "optim.outer_momentum=0.5", f"trainer.max_steps={steps}", f"run.root={hq(run_root)}",
         "run.name=diloco_heal"],
        cwd=ROOT, env=launcher_env(SLURMTRAIN_TRACE_REPLICAS=str(trace)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(f"group 1 at step {kill_at}", lambda: len(_digests(trace, 1)) >= kill_at, proc=proc)
        os.kill(_pid(run_dir, 1, 0), signal.SIGKILL)
        killed_at = max(_digests(trace, 1))  # the steps it had done: killed in the next
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    assert proc.returncode == 0, err[-4000:]
    assert "replica group 1 lost" in err and "it heals from a live group" in err, err[-4000:]
    healed = _healed_at(run_dir, 1)  # the step before the sync it healed at (state.step: the sync's step less one)
    assert (healed + 1) % every == 0 and killed_at <= healed < steps, healed
    # From the sync it healed at on, group 1's weights are group 0's, bit for bit, after every sync (the digests are
    # keyed by the steps done as a step starts); between syncs each group trains on its own data.
    mine, theirs = _digests(trace, 1), _digests(trace, 0)
    after = [s for s in range(healed + 1, steps, every) if s in mine]
    assert len(after) == (steps - healed - 1) // every and all(mine[s] == theirs[s] for s in after), healed
    assert any(mine[s] != theirs[s] for s in range(healed + 2, healed + every + 1)), healed  # the check can fail
    final = [weights(group_dir(run_dir, g) / "checkpoints" / f"step_{steps}", tmp_path) for g in range(2)]
    assert final[0].keys() and all(torch.equal(final[1][k], v) for k, v in final[0].items())
    # The ledger: one loss, from the interval group 1 was killed in to the first after its heal; its share of every
    # step in between (1 rank x micro 8 of each step's 16 samples) is named as not trained.
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (loss,) = [e for e in events if e["kind"] == "replica_rejoined"]
    assert loss["groups"] == [1] and loss["lost_step"] == killed_at // every * every + 1, (killed_at, loss)
    assert loss["rejoined_step"] == healed + 2 and loss["reduced_steps"] == healed + 2 - loss["lost_step"], loss
    want = [[(s - 1) * 16 + 8, s * 16] for s in range(loss["lost_step"], loss["rejoined_step"])]
    assert loss["missed_samples"] == want, loss
    print(f"launch {took:.0f} s; killed at step {killed_at}, healed at the sync of step {healed + 1}")
