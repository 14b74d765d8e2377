"""Replicas: what the training loop calls when parallel.replica_groups > 1 (train/loop.py).

    replicas = open_replicas(cfg, env, device, run_dir, strategy)   # None without replica groups
    replicas.heals                      # a restarted group: take the state from a live peer, read no checkpoint
    replicas.start_step(state)          # the step's quorum; a healing group's state is replaced here
    strategy.optimizer_step()           # calls replicas.average(params) -> False: the step is discarded
    replicas.committed                  # False: the loop trains the same step again
    replicas.step_done(state)           # the ledger; under optim.outer=diloco, every sync_every steps the sync
                                        # (its quorum, the pseudo-gradients' average, the outer step: diloco.py)
    replicas.agree_stop(watcher)        # after the group's own stop agreement: stop together, alone, or not yet
    replicas.stopped(outcome)           # locally, a group that stopped alone exits EXIT_LEFT (started again)
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from contract.errors import EXIT_STOPPED
from contract.rundir import replicas as contract
from contract.rundir.events import record_event
from train.distributed import cpu_group
from train.faults.preemption import NOTHING, REQUEUE, all_reduce_max_each
from train.faults.signals import preempt_signal
from train.observe.metrics import log
from train.replicas.averaging import CrossGroupAverage
from train.replicas.diloco import OuterStep
from train.replicas.ledger import Ledger
from train.replicas.liveness import watch_peers
from train.replicas.manager import (
    heal_patience_s,
    held_state,
    lighthouse_address,
    load_held_state,
    make_manager,
    start_barrier,
)
from train.replicas.peers import lighthouse_gone, lighthouse_gone_error, place_on_slurm, slurm_array
from train.replicas.stops import ALONE, TOGETHER, StopRule, kind_name

# Tests set this to a directory: each rank appends "STEP DIGEST" of its weights as each step starts (_trace).
TRACE_ENV = "SLURMTRAIN_TRACE_REPLICAS"


class Replicas:
    def __init__(self, cfg: Any, env: Any, device: torch.device, run_dir: Path, strategy: Any, group: int,
                 groups: int) -> None:
        self.env, self.strategy, self.group, self.groups = env, strategy, group, groups
        self.main_dir = Path(run_dir) if group == 0 else Path(run_dir).parent.parent
        self.heals = os.environ.get(contract.HEAL_ENV) == "1"
        self.state: Any = None
        self.committed = True
        self.healed_at: int | None = None
        self.present: list[int] = list(range(groups))
        group_dp = strategy.dp_size
        # The data: every group reads its own share of each global batch (train/data/batches.py).
        strategy.dp_rank, strategy.dp_size = group * group_dp + strategy.dp_rank, groups * group_dp
        strategy.replica_groups, strategy.replicas = groups, self
        t = cfg.trainer
        self.ledger = Ledger(self.main_dir, group, groups, group_dp, int(t.micro_batch_size), int(t.grad_accum_steps))
        self.cfg, self.device = cfg, device
        self.manager: Any = None  # made at the first step: a group heartbeats only once it is about to join
        self.liveness = watch_peers(cfg, env, group)  # a frozen rank of this group ends it (liveness.py)
        self.resumed_step = 0
        # A stop one group's ranks agreed on goes to the others with every exchange from then on (stops.py decides).
        self.stops, self.left, self.preempt = StopRule(group), False, preempt_signal(cfg)
        # optim.outer=diloco: the groups meet only at its syncs (step_done); its state goes into each checkpoint.
        diloco = cfg.optim.get("outer", "none") == "diloco"
        self.outer = OuterStep(cfg.optim, strategy.model) if diloco else None
        self.checkpointed: dict[str, Any] = {"diloco": self.outer} if self.outer is not None else {}
        self.interval: list[tuple[int, int]] = []  # DiLoCo: (step, first sample) of each step since the last sync
        if env.is_main:
            log.info("replica group %d of %d: %d rank(s), data-parallel ranks %d-%d of %d; lighthouse %s%s", group,
                     groups, env.world_size, strategy.dp_rank, strategy.dp_rank + group_dp - 1, strategy.dp_size,
                     os.environ.get(contract.LIGHTHOUSE_ENV), "; healing from a live group" if self.heals else "")

    def _connect(self) -> None:
        """The Manager, just before the first quorum (a group that heartbeats but has not joined holds the others'
        quorum for up to the join timeout); on a fresh start, the barrier that lets the first quorum hold every
        group."""
        self.manager, self._store = make_manager(self.cfg, self.env, self.device, self.group, self._load, self._save)
        step = self.resumed_step  # the Manager counts commits: steps, or DiLoCo's syncs
        if self.outer is not None:  # one more, so that a restarted group (0) is behind a live one from the start on
            step = 0 if self.heals else self.outer.syncs + 1
        self.manager.load_state_dict({"step": step, "batches_committed": step * self.groups})
        if self.heals:  # no wait: a group of a whole-run resume still waiting there must not wait for it
            ready = contract.ready_file(self.main_dir, os.environ.get(contract.LAUNCH_ENV, "local"), self.group)
            if self.env.is_main:
                ready.parent.mkdir(parents=True, exist_ok=True)
                ready.touch()
        else:
            start_barrier(self.main_dir, os.environ.get(contract.LAUNCH_ENV, "local"), self.group, self.groups,
                          float(self.cfg.watchdog.startup_timeout_s), self.env.is_main, lighthouse_address(self.cfg))
        self.average_ = CrossGroupAverage(self.manager, self.group, self.groups)

    # -- the Manager's state callbacks (run inside its quorum, while the main thread waits in start_quorum) --------
    def _save(self) -> dict[str, Any]:
        s = self.strategy
        trainer = {f.name: getattr(self.state, f.name) for f in fields(self.state)}
        held = held_state(s.model, s.optimizer, s.scheduler, trainer)
        return held if self.outer is None else {**held, "outer": self.outer.held()}

    def _load(self, state: dict[str, Any]) -> None:
        s = self.strategy
        if self.outer is not None:
            self.outer.load_held(state["outer"])
        for name, value in load_held_state(s.model, s.optimizer, s.scheduler, state).items():
            setattr(self.state, name, value)

    # -- the loop's calls ------------------------------------------------------------------------------------------
    def resumed(self, step: int) -> None:
        """A checkpoint was loaded (a whole-run resume): the Manager's step is the trainer's, never 0 (with no live
        peer a restarted group would otherwise start over in silence)."""
        self.resumed_step = step

    def start_step(self, state: Any) -> None:
        self.state = state
        if self.manager is None:
            self._connect()
        if self.outer is None:  # DiLoCo's quorum is its sync's (step_done)
            self._quorum(state)
        if os.environ.get(TRACE_ENV):
            self._trace(state.step)

    def _quorum(self, state: Any) -> bool:
        """The quorum; True: this group healed in it (took a live group's state, its counters included)."""
        before, started = self.manager.current_step(), time.monotonic()
        self._start_quorum()
        if self.heals and self.healed_at is None:
            self._await_live_group()
        healed = self.manager.current_step() > before
        if healed and self.healed_at is None:
            self.healed_at = state.step
            if self.env.is_main:
                log.info("healed from a live group at step %d in %.2f s (no checkpoint read)", state.step,
                         time.monotonic() - started)
        if self.healed_at is None:
            self.healed_at = -1  # the first quorum is done: a later catch-up is a heal too, logged by torchft
        return healed

    def _start_quorum(self) -> None:
        try:
            self.manager.start_quorum()
        except Exception as err:
            if slurm_array() is not None and (gone := lighthouse_gone(self.main_dir)):  # gone for good: no requeue
                raise lighthouse_gone_error(self.main_dir, self.group, gone) from err
            raise

    def _await_live_group(self) -> None:
        """A group started to heal whose quorum holds no group ahead of it asks again: a live group can be kept out
        of a quorum for a while (held in a collective with the lost group until its timeout, or its heartbeat late on
        a loaded host), and the lighthouse then gives this group a quorum of its own after the join timeout. Only
        when none has come within heal_patience_s does it exit EXIT_NO_PEER, to start from the checkpoint. Counted
        in tries, not time, so that every rank of the group (each sees the same quorums) decides alike."""
        if self.manager.current_step() > 0:
            return
        patience, pause = heal_patience_s(self.cfg.parallel)
        if self.env.is_main:
            log.info("replica group %d was started to heal but its quorum holds no live group ahead of it yet: asking "
                     "again for up to %.0f s", self.group, patience)
        agree, alone = cpu_group(), 0
        for _ in range(math.ceil(patience / pause)):
            time.sleep(pause)
            self._start_quorum()
            if self.manager.current_step() > 0:
                return
            alone = alone + 1 if self._no_other_group(agree, pause) else 0
            if alone == 2:  # twice in a row, a pause apart: they finished the run, or were lost too
                break
        if self.env.is_main:
            why = ("no other group heartbeats to the lighthouse" if alone == 2 else
                   f"no live group is ahead of it after {patience:.0f} s")
            log.error("replica group %d was started to heal but %s: exiting so that it starts from the checkpoint "
                      "instead", self.group, why)
        raise SystemExit(contract.EXIT_NO_PEER)

    def _no_other_group(self, agree: Any, timeout_s: float) -> bool:
        """Rank 0 asks the lighthouse whether any other group heartbeats; every rank of the group gets its answer
        (unasked or unanswered: as if one did)."""
        address = lighthouse_address(self.cfg)
        none = 0
        if self.env.is_main and address:
            live = contract.live_groups(str(address), timeout_s=timeout_s)
            none = int(live is not None and not live - {self.group})
        return bool(all_reduce_max_each([none], agree)[0])

    def _trace(self, step: int) -> None:
        """Tests: a digest of this rank's weights as each step starts (after its quorum, a heal included)."""
        digest = hashlib.sha256()
        for _, p in sorted(self.strategy.model.named_parameters()):
            local = p.detach().to_local() if hasattr(p, "to_local") else p.detach()
            digest.update(local.cpu().contiguous().view(torch.uint8).numpy().tobytes())
        path = Path(os.environ[TRACE_ENV]) / f"group{self.group}_rank{self.env.rank}.txt"
        with open(path, "a") as f:
            f.write(f"{step} {digest.hexdigest()}\n")

    def average(self, params: list[torch.nn.Parameter]) -> bool:
        """The gradients averaged across the groups; False: the step is discarded (a peer was lost in it). Under
        DiLoCo nothing crosses the groups here: each steps its inner optimizer on its own gradients."""
        if self.outer is not None:
            return True
        self.present, asks = self.average_.average(params, self.stops.pending)
        self.committed = bool(self.manager.should_commit())
        if self.committed:
            self.stops.heard(asks)
        return self.committed

    def agree_stop(self, watcher: Any) -> bool:
        """After the group's own stop agreement (watcher.stop_requested), on every rank: whether this group stops
        now (stops.py). Every group of the quorum asked: all stop at this step (a whole-run stop resumes exactly);
        only some: they wait a little for the others, then stop alone and leave the quorum. Sets watcher.agreed to
        the kind taken (stop or requeue; nothing: train on)."""
        step = self.state.step
        if self.stops.ask(int(watcher.agreed)) and self.env.is_main:
            log.info("replica group %d asked to stop (%s) at step %d; the other groups hear it with the next %s",
                     self.group, kind_name(int(watcher.agreed), self.preempt), step,
                     "sync" if self.outer is not None else "step")
        others = [g for g in self.stops.newly_asked() if g != self.group]
        if others and self.stops.pending == NOTHING and self.env.is_main:
            kinds = self.stops.last.kinds
            log.info("replica group(s) %s asked to stop (%s) by step %d, this group not: if it is asked too within "
                     "%.0f s every group stops together, otherwise they stop alone and this group trains on", others,
                     ", ".join(sorted({kind_name(kinds[g], self.preempt) for g in others})), step, self.stops.wait_s)
        decision, kind = self.stops.decide(
            lambda expired: bool(all_reduce_max_each([int(expired)], cpu_group())[0]))
        watcher.agreed = kind
        if decision == TOGETHER and self.env.is_main:
            log.info("every replica group of the quorum (%s) asked to stop: all stop together at step %d",
                     sorted(self.stops.last.kinds), step)
        elif decision == ALONE:
            self._leave(step, kind)
        return decision is not None

    def _leave(self, step: int, kind: int) -> None:
        """This group stops alone: it checkpoints and leaves the quorum; the groups that did not ask go on."""
        self.left = True
        asks = self.stops.last.kinds
        going_on = [g for g in self.present if g not in asks]
        if not self.env.is_main:
            return
        signal_name = kind_name(kind, self.preempt)
        log.info("replica group %d stops alone at step %d (%s reached only it: the others did not ask within %.1f s); "
                 "groups %s go on", self.group, step, signal_name, self.stops.waited_s, going_on)
        record_event(self.main_dir, contract.LEFT, group=self.group, step=step, signal=signal_name,
                     requeue=kind == REQUEUE, waited_s=round(self.stops.waited_s, 3), groups_on=going_on)

    def stopped(self, outcome: Any) -> Any:
        """The loop's stop outcome; a local group that stopped alone exits EXIT_LEFT, so that its launcher starts
        it again to heal (launcher/run/replica_groups.py); under SLURM its task's end is as for any stop."""
        if self.left and outcome.exit_code == EXIT_STOPPED:
            return replace(outcome, exit_code=contract.EXIT_LEFT)
        return outcome

    def step_done(self, state: Any) -> None:
        """Before the loop counts the step: state.samples is still its first sample."""
        if self.outer is None:
            self.ledger.step(state.step + 1, state.samples, self.present, self.env.is_main)
            return
        self.interval.append((state.step + 1, state.samples))
        if self.outer.due(state.step + 1) or (self.heals and self.healed_at is None):
            self._sync(state)

    def _sync(self, state: Any) -> None:
        """DiLoCo's sync: the quorum (a restarted group heals here, at the sync it joins: the peer's weights after
        its interval, its global weights and outer momentum; its data of this interval is not counted as trained),
        the pseudo-gradients averaged, the outer step; a failed commit vote discards the interval."""
        assert self.outer is not None  # only under optim.outer=diloco
        healed = self._quorum(state)
        if healed:
            self.interval = [(state.step + 1, state.samples)]
        present, asks = self.average_.average(self.outer.pseudo_gradients(), self.stops.pending,
                                              counted=not healed)
        committed = bool(self.manager.should_commit())
        self.outer.apply(committed)
        if committed:
            self.present = present
            self.stops.heard(asks)
            for step, position in self.interval:
                self.ledger.step(step, position, present, self.env.is_main)
        else:
            if self.env.is_main:
                log.warning("the DiLoCo sync at step %d failed (a group was lost in it): steps %d-%d are discarded, "
                            "the weights are the last sync's", state.step + 1, self.interval[0][0], state.step + 1)
            self.ledger.discarded(self.interval, self.env.is_main)
        self.interval = []

    def close(self) -> None:
        if self.liveness is not None:  # this rank ends normally: not to be taken for frozen by its peers
            self.liveness.stop()
        self.ledger.close(self.env.is_main, self.present)
        if self.env.is_main and self.manager is not None:
            log.info("cross-group all-reduces: %d", self.average_.allreduces)  # tests compare schemes by it
        if self.manager is None:
            return
        try:
            self.manager.shutdown(wait=False)
        except Exception as err:  # noqa: BLE001 - its threads go with the process anyway
            log.warning("torchft's manager did not shut down cleanly: %s", err)


def open_replicas(cfg: Any, env: Any, device: torch.device, run_dir: Path, strategy: Any) -> Replicas | None:
    """The replica group this rank is in, from its launcher's environment; None without replica groups."""
    groups = int(cfg.parallel.get("replica_groups", 1))
    if groups <= 1:
        return None
    group = int(os.environ.get(contract.GROUP_ENV, "0"))
    main_dir = Path(run_dir) if group == 0 else Path(run_dir).parent.parent
    # Under a SLURM array the ranks find the lighthouse and decide whether to heal themselves (train/replicas/peers.py)
    place_on_slurm(cfg, env, main_dir, group, lambda values: all_reduce_max_each(values, cpu_group()))
    return Replicas(cfg, env, device, run_dir, strategy, group, groups)
