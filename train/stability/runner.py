"""The loop's one stability object: the hooks train/loop.py calls, in the order it calls them.

    step_start     the step's data position, past the skipped sample ranges
    check(loss)    the on-device verdict the strategy applies before its update (None: checks off)
    wanted()       what the verdicts seen so far call for, without waiting (the stop agreement carries it)
    replicas_agree after every update: the periodic replica check (replicas.py) where due
    before_save()  at a save: every verdict read (one sync), the state checked finite, the replicas compared
    recover()      roll back or stop, on every rank at the same step (silent data corruption: corruption.py)
    log_fields()   at a log step: counts for metrics.jsonl; skipped steps into events.jsonl; the loss into the
                   run's loss history (its start, best and last: blowup.py)

What the next steps' decisions depend on goes into each checkpoint's trainer state (state_dict, at a save) and
comes back at a resume and at a rollback to that checkpoint (restore): the spike rule's window, the run of skipped
steps in a row, the data position of the steps a rollback may reach back to, the counts and the loss history. So
a run stopped and resumed decides as the uninterrupted run does, and a rollback goes on as a resume from its
checkpoint would. Each checkpoint's marker records its step's loss and the best up to it: a checkpoint far above
that best (blowup.py) is no rollback target and not "good" in the stop line.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from contract.errors import EXIT_DIVERGED
from contract.rules.blowup import DEFAULT_MARGIN, LossHistory
from contract.rules.stability_checks import plan_note
from contract.rundir import ckpt_layout as layout
from contract.rundir.events import record_event
from contract.rundir.skipped_samples import SkippedSamples
from train.distributed import cpu_group
from train.observe import sync_count
from train.observe.metrics import log
from train.stability.advice import diagnose, stop_advice
from train.stability.blowup_warning import BlowupWarning
from train.stability.codes import DeviceCodes
from train.stability.corruption import CORRUPTION, respond
from train.stability.monitor import NOTHING, ROLLBACK, STOP, Monitor, Trouble
from train.stability.replicas import Disagreement, ReplicaCheck
from train.stability.rollback import rollback
from train.stability.state_check import state_is_finite
from train.stability.targets import Targets, plain_norm
from train.stability.verdict import NONFINITE, SCALER, SpikeRule, StepVerdict, apply_with_skip, skip_flag
from train.stability.z_loss import ZLoss

# Steps whose data position is kept for a rollback's sample ranges.
KEPT_STARTS = 4096
# Saves whose loss is kept for their COMPLETE marker (an asynchronous save completes a few steps later).
KEPT_SAVE_LOSSES = 8
# The checkpoint trainer state's entry (train/checkpoints/manager.py writes what state_dict returns into it).
STATE_KEY = "stability"


class Stability:
    def __init__(self, cfg: Any, env: Any, device: torch.device, run_dir: Path, strategy: Any, ckpt: Any,
                 global_batch: int) -> None:
        s = cfg.stability
        self.env, self.run_dir, self.strategy, self.ckpt = env, Path(run_dir), strategy, ckpt
        self.global_batch = global_batch
        self.enabled = bool(s.enabled)
        self.skips = SkippedSamples(run_dir)
        deepspeed = strategy.checkpoint_format == "deepspeed"
        policy = "rollback" if deepspeed and s.nonfinite == "skip" else str(s.nonfinite)
        note = plan_note(cfg)
        if note and env.is_main:
            log.info("%s", note)
        self.policy = policy
        self.monitor = Monitor(policy, int(s.skip_limit), int(s.max_rollbacks), self.skips.rollbacks)
        spike = SpikeRule(float(s.spike_sigma), int(s.spike_window), device) if float(s.spike_sigma) > 0 else None
        self.verdict = StepVerdict(spike, env.world_size, device, scaler=strategy.scaler) if self.enabled else None
        self.codes = DeviceCodes(device)
        z = float(cfg.optim.get("z_loss", 0.0))
        self.z = ZLoss(z) if z > 0 else None
        self.margin = int(s.skip_margin_steps)
        self.starts: dict[int, int] = {}
        # Not the checkpoint's group: an asynchronous save runs its collectives on that one from its own thread, and
        # an all-reduce here could interleave with them (both ranks hung). A collective: every rank, same order.
        self.group = cpu_group()
        # Replica consistency: built on every rank here (a collective); each checkpoint's marker says if it passed.
        self.replicas = ReplicaCheck(int(s.replica_check_every) if self.enabled else 0, env, strategy)
        ckpt.verified = self.replicas.verified
        self.found: Disagreement | None = None
        self.step, self.cfg = 0, cfg
        # The run's start, best and last loss (blowup.py), and the loss of each recent save for its marker.
        self.losses = LossHistory()
        self.blowup_margin = float(s.get("blowup_margin", DEFAULT_MARGIN))
        vocab = OmegaConf.select(cfg, "model.vocab_size")
        self.vocab_size = int(vocab) if vocab is not None else None
        self.loss: torch.Tensor | None = None  # this rank's loss of the newest step (a device tensor)
        self.norm: Any = None  # the newest step's gradient norm, as the strategy measured it
        self.targets = Targets(self.run_dir, self.vocab_size, self.blowup_margin)
        self.warning = BlowupWarning(self.vocab_size, self.blowup_margin, float(cfg.optim.lr),
                                     OmegaConf.select(cfg, "trainer.max_steps"), env.is_main)
        self.save_losses: dict[int, dict[str, Any]] = {}
        ckpt.losses_at = lambda step: self.save_losses.get(step, {})
        self.state_nonfinite = False  # a save found the weights or optimizer state not finite
        ckpt.extra_state = self.state_dict  # rank 0, at each save
        if ckpt.loaded:  # resumed: decide on as the run did before it stopped
            self.restore(ckpt.loaded)

    # -- every step ----------------------------------------------------------------------------------------
    def step_start(self, step: int, position: int) -> int:
        if self.skips.ranges:
            position = self.skips.start(position, self.global_batch)
        self.starts[step] = position
        if len(self.starts) > KEPT_STARTS:
            del self.starts[next(iter(self.starts))]
        return position

    def check(self, loss: torch.Tensor, step: int) -> Callable[[Any], torch.Tensor] | None:
        """What the strategy calls with the gradient norm: pushes the step's code, returns the skip flag."""
        verdict = self.verdict
        if verdict is None:
            return None
        self.loss = loss  # detached already (train_step, the pipeline's step): no graph is kept alive
        shared = verdict.share(loss)

        def judged(norm: Any) -> torch.Tensor:
            self.norm = norm
            code = verdict(shared if shared is not None else loss, norm)
            self.codes.push(step, code)
            return code if verdict.spike is None and not verdict.fp16 else skip_flag(code)  # 0.0 or 1.0 already

        return judged

    def replicas_agree(self, step: int) -> int:
        """Every rank after every update (collective): the periodic replica check where due; CORRUPTION if not."""
        self.step = step
        if self.replicas.due(step):
            sync_count.busy("replica check")  # a periodic check (stability.replica_check_every): it reads
        self.found = self.replicas.after_step(step)
        return CORRUPTION if self.found else NOTHING

    def wanted(self, drain: bool = False) -> int:
        """NOTHING, ROLLBACK or STOP from the verdicts that reached the host (all of them with `drain`)."""
        if self.verdict is None:
            return NOTHING
        for step, code in self.codes.drain() if drain else self.codes.ready():
            self.monitor.observe(step, code)
        return self.monitor.action()

    def before_save(self) -> int:
        """At a save: every verdict read, the step's loss known (for the marker), and the weights and optimizer
        state finite on every rank."""
        action = self.wanted(drain=True)
        if self.verdict is not None and self.loss is not None:
            self._save_loss()
        self._record_skipped()  # now: a stop after this save would lose them
        if action == NOTHING and self.enabled and not state_is_finite(self.strategy, self.group):
            self.monitor.trouble_steps = [max(self.starts, default=0)]
            self.state_nonfinite = True
            action = STOP if self.policy == "stop" or self.monitor.rollbacks_done >= self.monitor.max_rollbacks \
                else ROLLBACK
            if self.env.is_main:
                log.error("the weights or optimizer state are not finite: not saving them")
        if action == NOTHING and self.replicas.enabled:  # before the save: its marker records the verdict
            self.found = self.replicas.check(self.step)
            action = CORRUPTION if self.found else NOTHING
        return action

    def log_fields(self, step: int, loss: float | None = None) -> dict[str, Any]:
        """metrics.jsonl's stability fields at a log step (the loss read has already waited for the device);
        `loss`: the step's, averaged over the ranks, into the loss history."""
        fields: dict[str, Any] = {}
        if self.verdict is not None:
            if loss is not None:
                self.losses.observe(step, loss)
                self.warning.observe(self.losses, step, loss)
            self.wanted(drain=True)
            self._record_skipped()
            fields.update(skipped_steps=self.monitor.nonfinite, spikes=self.monitor.spikes)
            if self.verdict.fp16:
                fields["scaler_skipped"] = self.monitor.scaler_skipped
        if self.z is not None and self.z.last is not None:
            from train.distributed import all_reduce_mean

            fields["z_loss"] = float(all_reduce_mean(self.z.last))
        return fields

    def _save_loss(self) -> None:
        """The saved step's loss, averaged over the ranks (a collective: one at a save, none where the step was
        logged), into the loss history and its marker."""
        from train.distributed import all_reduce_mean

        step = self.step
        if self.losses.last_step == step and self.losses.last is not None:
            value = self.losses.last
        else:
            assert self.loss is not None
            value = float(all_reduce_mean(self.loss))
            self.losses.observe(step, value)
        # Strict JSON: a loss that is not finite as "nan" or "inf" (ckpt_layout.marker_losses reads them back).
        self.save_losses[step] = {"loss": value if math.isfinite(value) else str(value), "best": self.losses.best}
        norm = plain_norm(self.norm)
        if norm is not None:  # a collapsed model's is often zero (targets.py)
            self.save_losses[step]["grad_norm"] = norm
        for old in sorted(self.save_losses)[:-KEPT_SAVE_LOSSES]:
            del self.save_losses[old]

    # -- when something went wrong -------------------------------------------------------------------------
    def recover(self, action: int, step: int) -> dict[str, Any] | Any:
        """Every rank, at the same step: a checkpoint's trainer state to go on from (rolled back), or the
        StopOutcome that ends the run."""
        self.wanted(drain=True)  # every rank now knows every verdict: the same decision everywhere
        self._record_skipped()
        if action == CORRUPTION and self.found is not None:
            saved = respond(self.found, self.replicas, self.ckpt, self.skips, self.cfg, self.monitor.max_rollbacks, step)
            if isinstance(saved, dict):
                self._rolled_back(saved)
            return saved
        action = max(action, self.monitor.action())
        trouble = self.monitor.trouble(action)
        self.targets.trouble_from(min(trouble.bad_steps, default=step))
        if action == ROLLBACK:
            saved = self._rollback(trouble, step)
            if saved is not None:
                return saved
            trouble.limit += ", and no good checkpoint before it to roll back to"
        return self._stop(trouble, step)

    def _rollback(self, trouble: Trouble, step: int) -> dict[str, Any] | None:
        margin = self.margin
        first = min(trouble.bad_steps, default=step) - margin
        last = max(trouble.bad_steps, default=step)
        start = self.starts.get(first, self.starts.get(min(self.starts, default=first), 0))
        end = self.starts.get(last, start) + self.global_batch * (1 + margin)
        reason = f"{trouble.reason} at step {_steps(trouble.bad_steps)}"
        saved = rollback(self.ckpt, self.skips, step, to=self.targets.good(first), skip=[(start, end)], reason=reason)
        if saved is not None:  # its trainer state's step: no second choice (a collective) to learn which it was
            self.targets.rolled_to = int(saved["step"]) if "step" in saved else None
            self._rolled_back(saved)
        return saved

    def _rolled_back(self, saved: dict[str, Any]) -> None:
        """As a resume from that checkpoint would go on: its window, its run of skipped steps, its positions."""
        self.codes.clear()
        self.restore(saved)
        self.monitor.rollbacks_done = self.skips.rollbacks

    # -- in each checkpoint --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """For the checkpoint's trainer state (rank 0, at a save: every verdict read, nothing to act on). The same
        on every rank: the window holds values the ranks share, the monitor counts verdicts they share."""
        step = max(self.starts, default=0)
        # The oldest step a rollback from here may skip the samples of: the first of a run of skipped steps that
        # reaches skip_limit just after this save, less the margin.
        since = step - self.monitor.skip_limit - self.margin
        state: dict[str, Any] = {"monitor": self.monitor.state_dict(),
                                 "starts": [[s, p] for s, p in self.starts.items() if s > since],
                                 "losses": self.losses.state_dict()}
        spike = self.verdict.spike if self.verdict is not None else None
        if spike is not None:
            state["spike"] = spike.state_dict()
        return {STATE_KEY: state}

    def restore(self, saved: dict[str, Any]) -> None:
        """A checkpoint's trainer state (a resume's, a rollback's): what state_dict saved, or a fresh start where
        an older checkpoint has none (said in one line)."""
        state = saved.get(STATE_KEY)
        spike = self.verdict.spike if self.verdict is not None else None
        self.starts.clear()
        self.monitor.load_state_dict({} if state is None else state.get("monitor", {}))
        self.starts.update({int(s): int(p) for s, p in ([] if state is None else state.get("starts", []))})
        notes = [] if state is not None else ["an older slurmtrain wrote it without its stability state: the run of "
                                              "skipped steps in a row starts afresh"]
        self.losses.load_state_dict({} if state is None else state.get("losses", {}))
        if self.verdict is not None and (state is None or "losses" not in state):
            notes.append("it holds no loss history: the run's start and best loss are those logged from here on")
        if spike is not None and state is not None and "spike" in state:
            notes.append(spike.load_state_dict(state["spike"]) or "")
        elif spike is not None:
            spike.reset()
            notes.append(f"it holds no spike-rule window: the window starts empty, and no step is checked for spikes "
                         f"until it holds {int(spike.min_count)} values")
        notes = [n for n in notes if n]
        if notes and self.env.is_main:
            log.info("checkpoint step %s: %s", saved.get("step", "?"), "; ".join(notes))

    def _stop(self, trouble: Trouble, step: int) -> Any:
        from train.faults.preemption import StopOutcome

        self.ckpt.wait()  # a save in flight is from before the trouble: it completes, and is the one to name
        # The newest complete checkpoint from before the first bad step whose loss is not far above the best, as a
        # rollback would choose: a skip-mode save inside the trouble holds finite weights, but not good ones.
        first = min(trouble.bad_steps, default=step + 1)
        complete = [c.step for c in layout.list_checkpoints(self.run_dir) if c.complete]
        good = next((s for s in reversed(complete) if self.targets.good(first)(s)), None)
        not_good = {s: why for s in complete if s < first and (good is None or s > good)
                    for why in [self.targets.why_not(s)] if why}
        one_step = (self.policy == "stop" and len(trouble.bad_steps) == 1 and not trouble.limit
                    and not self.monitor.tripped and not self.state_nonfinite)
        cause = diagnose(self.losses, self.vocab_size, self.blowup_margin, one_step=one_step,
                         dead=sorted(self.targets.dead), at_once=first <= 1,
                         init_from=OmegaConf.select(self.cfg, "model.init_from"))
        advice = stop_advice(self.run_dir, good, float(self.cfg.optim.lr), str(self.cfg.run.name), cause,
                             latest=complete[-1] if complete else None, blown=not_good)
        line = (f"error: stopped at step {step}: {trouble.reason} at step {_steps(trouble.bad_steps)}{trouble.limit} "
                f"(stability.nonfinite={self.policy}); {advice}")
        if self.env.is_main:  # the end itself is recorded as a "diverged" event by train/recovery.end_of_attempt
            from train.faults.recovery import _to_rank_log

            _to_rank_log(logging.ERROR, line, None)
            print(line, file=sys.stderr, flush=True)
        # For launcher.status: the checkpoints after the good one are an abandoned branch the same command would resume.
        abandoned = [s for s in complete if good is None or s > good]
        return StopOutcome(EXIT_DIVERGED, None, stopped=True, kind="diverged",
                           details={"good_step": good, "abandoned": abandoned})

    def _record_skipped(self) -> None:
        """One events.jsonl line per skipped step, with its samples (rank 0)."""
        skipped = self.monitor.take_unreported()
        if not self.env.is_main:
            return
        from train.faults.preemption import slurm_job_id

        for step, code in skipped:
            start = self.starts.get(step)
            reason = "nonfinite" if code & NONFINITE else "loss_scale" if code & SCALER else "spike"
            record_event(self.run_dir, "skipped_step", job=slurm_job_id(), step=step, reason=reason,
                         samples=None if start is None else [start, start + self.global_batch])
            collapsed = code & SCALER and code & NONFINITE
            log.log(logging.INFO if reason == "loss_scale" else logging.WARNING, "step %d not applied: %s", step,
                    REASONS["collapsed" if collapsed else reason])


REASONS = {"nonfinite": "non-finite gradient norm or loss", "spike": "loss or gradient norm spike",
           "loss_scale": "a gradient overflowed in fp16 (the loss scaler skipped it and lowered its scale)",
           "collapsed": "a gradient overflowed in fp16 with the loss scale already at its floor (1): non-finite"}


def _steps(steps: list[int]) -> str:
    if not steps:
        return "?"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


__all__ = ["Stability", "apply_with_skip", "NOTHING", "ROLLBACK", "STOP"]
