"""The training loop: resume, micro steps with accumulation, one optimizer step, log, agree on stopping, save."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from contract.config.schema import TrainerConfig
from contract.data.fingerprint import data_fingerprint, refuse_changed_data
from contract.rules.log_backends import backends
from contract.rules.step_options import step_line
from contract.rules.verify_early import enabled as verify_early_enabled
from contract.rundir.events import settle_steps_lost
from train import distributed
from train.checkpoints.early_check import verify_round_trip
from train.checkpoints.manager import CheckpointManager
from train.data import (
    TokenSource,
    build_source,
    data_progress,
    planned_micro_batches,
)
from train.data.index import INDEX_VERSION, LEGACY_INDEX_VERSION
from train.data.prefetch import BatchPrefetcher, describe_dropped
from train.distributed import DistEnv
from train.evaluation.validator import Validator
from train.faults.preemption import PreemptionWatcher, StopOutcome, after_stop
from train.faults.signals import StopFlag, preempt_signal
from train.faults.watchdog import Watchdog
from train.gc_control import GcControl
from train.loss import TokenCount
from train.model.build import build_model, flops_per_token
from train.observe import sync_count
from train.observe.metrics import IntervalLoss, MetricsLogger, log
from train.observe.moe_stats import moe_fields
from train.observe.telemetry import Telemetry
from train.replicas import open_replicas
from train.search.trial_report import TrialReporter
from train.stability.runner import NOTHING, Stability
from train.step import StepSettings, TrainResult, TrainState, train_step
from train.strategies import build_strategy
from train.strategies.base import Strategy
from train.weights.final_export import export_at_end
from train.weights.init_weights import refuse_lost_init, start_from


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def restore(ckpt: CheckpointManager, cfg: Any, env: DistEnv) -> TrainState:
    latest = ckpt.latest() if cfg.run.resume else None
    if latest is None:
        return TrainState()
    # Before loading anything: a checkpoint trained on other data is not resumed (the launcher refused it already,
    # unless the data changed since, e.g. before a requeue).
    refuse_changed_data(cfg.data, latest.path, latest.step, on_ranks=True)
    state = resumed_state(ckpt.load(latest))
    if env.is_main:
        log.info("resumed from %s: step %d, %d samples consumed", latest.path, state.step, state.samples)
        if state.data_index != INDEX_VERSION:
            log.info("this run keeps the data order of its first checkpoints (index version %d): it resumes on "
                     "exactly the samples it would have read", state.data_index)
        settle_steps_lost(ckpt.run_dir, state.step)
    return state


def resumed_state(saved: dict[str, Any]) -> TrainState:
    """The TrainState a checkpoint's trainer state holds."""
    saved.setdefault("data_index", LEGACY_INDEX_VERSION)
    return TrainState(**{f.name: saved.get(f.name, f.default) for f in fields(TrainState)})


def new_wandb_id(cfg: Any, env: DistEnv) -> str | None:
    if not env.is_main or "wandb" not in backends(cfg.logger.backend):
        return None
    from wandb.sdk.lib.runid import generate_id

    return str(generate_id())


def train(cfg: Any, env: DistEnv, device: torch.device, run_dir: Path, flag: StopFlag | None = None,
          hosts: list[str] | None = None, watchdog: Watchdog | None = None) -> TrainResult:
    """Train to cfg.trainer.max_steps, resuming if a checkpoint exists. `flag` is installed by entry.py at
    start-up so that an early signal is not lost; tests calling train() directly get one here. `hosts`: every
    rank's node name (entry.py gathers them; gathered here when not given)."""
    # The trainer section as plain values: the loop reads them every step, and an OmegaConf attribute read costs
    # tens of microseconds (a fixed cost per step that a GPU's short steps would feel).
    t = SimpleNamespace(**_plain(cfg.trainer))
    seq_len = int(cfg.data.seq_len)
    flag = flag or StopFlag(preempt_signal(cfg))
    own_watchdog = watchdog is None
    watchdog = watchdog or Watchdog(cfg, env.rank, env.world_size, run_dir)
    # Same seed on every rank for the initial weights; DDP also broadcasts them, FSDP needs them equal.
    seed_everything(t.seed)
    strategy = build_strategy(cfg, env, device)
    raw_model = build_model(cfg.model)
    # model.init_from, at a run's first start: into every rank's full model, before any strategy wraps it.
    init_applied = start_from(raw_model, cfg, run_dir, env)
    model_flops, _ = flops_per_token(raw_model, cfg.model, cfg.data.seq_len)
    model = strategy.setup(raw_model)
    if strategy.layout is not None:
        hosts = hosts or distributed.gather_hosts(env)  # a collective: every rank
        if env.is_main:
            log.info("layout: %s", layout_line(strategy.layout, hosts))
    if env.is_main:
        log.info("%s", step_line(cfg))  # what torch.compile compiles, CUDA graphs, when the collector runs
    ds_config = getattr(strategy, "ds_config", None)
    if env.is_main and ds_config is not None:
        # The generated DeepSpeed config is part of what explains this run (and is saved beside each checkpoint).
        (run_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=2) + "\n")
    # Per-rank stream for anything random after init (dropout); a resume restores the saved streams instead.
    seed_everything(t.seed + 1000 * env.rank)
    # parallel.replica_groups (train/replicas): this rank's group, its share of the data, the cross-group average.
    replicas = open_replicas(cfg, env, device, run_dir, strategy)
    ckpt = CheckpointManager(cfg, env, run_dir, strategy)
    ckpt.data_fingerprint = data_fingerprint(cfg.data, on_ranks=True)
    # A restarted replica group heals from a live one at its first quorum: it reads no checkpoint.
    state = TrainState() if replicas is not None and replicas.heals else restore(ckpt, cfg, env)
    if replicas is not None:
        replicas.resumed(state.step)
    refuse_lost_init(cfg, init_applied, state)
    # checkpoint.verify_early: a fresh run's first step is checkpointed, read back and compared, before it trains on.
    check_early = verify_early_enabled(cfg) and state.step == 0 and strategy.checkpoint_format == "dcp"
    state.wandb_id = state.wandb_id or new_wandb_id(cfg, env)
    if cfg.checkpoint.async_save and 0 < t.ckpt_every < t.max_steps - state.step:
        ckpt.prepare_async()  # the staging buffers, allocated once before training rather than in the first save

    source = build_source(cfg.data, cfg.model.vocab_size, state.data_index)
    global_batch = t.micro_batch_size * t.grad_accum_steps * strategy.dp_size
    step_settings = StepSettings.of(cfg)  # what train_step reads, read from the config once
    responses = bool(getattr(source, "micro_batch", None))  # supervised fine-tuning: only response tokens count
    # Peers read the same targets (tensor-parallel, stages); context-parallel ranks count their own chunks.
    tokens = TokenCount(responses, global_batch * seq_len,
                        env.world_size * strategy.replica_groups // (strategy.dp_size * strategy.cp), device)
    if env.is_main:
        log.info(
            "effective batch %d sequences (micro %d x accumulation %d x data-parallel %d) = %d tokens/step%s; "
            "strategy %s, precision %s, device %s",
            global_batch, t.micro_batch_size, t.grad_accum_steps, strategy.dp_size, global_batch * cfg.data.seq_len,
            " (only response tokens count, in the loss and in `tokens`)" if responses else "",
            strategy.name, cfg.precision.name, device,
        )
    watcher = PreemptionWatcher(env, device, flag)
    telemetry = Telemetry(cfg, env, device, run_dir, hosts, model_flops,
                          env.world_size * strategy.replica_groups // strategy.dp_size)
    metrics = MetricsLogger(cfg, env, run_dir, t.max_steps)
    metrics.start(state.step, state.tokens, state.wandb_id, _plain(cfg))
    losses: dict[int, float] = {}
    interval = IntervalLoss(state.loss_sum, state.loss_steps)  # loss_avg: the mean loss since the previous row
    outcome = StopOutcome(0, None)
    validator = Validator(cfg, strategy, device)
    trial = TrialReporter.open(run_dir, env)  # a search's trial reports its metric at each evaluation
    if validator.due_at_start(state.step, run_dir):  # step 0 (eval.at_start), or a resume at a step not validated
        start_values = validate(validator, model, watchdog, metrics)
        metrics.log_validation(state.step, state.tokens, start_values)
        if trial is not None:
            trial.report(state.step, start_values, decide=False)
    prefetcher: BatchPrefetcher | None = None
    stability = Stability(cfg, env, device, run_dir, strategy, ckpt, global_batch)
    gc_control = GcControl(getattr(t, "gc_every", TrainerConfig.gc_every))  # a config.yaml from before the key
    try:
        prefetcher = start_prefetch(source, state, cfg, strategy, device, stability)
        collected = time.perf_counter()
        gc_control.start()  # set-up is done: freeze what it made, collect every trainer.gc_every steps from here
        metrics.exclude(time.perf_counter() - collected)  # that collection is set-up, not the first row's throughput
        while state.step < t.max_steps:
            watchdog.step_started(state.step + 1)
            sync_count.step_begins(state.step + 1)  # a no-op unless a test or benchmark counts the host reads
            state.samples = stability.step_start(state.step + 1, state.samples)  # past skipped sample ranges
            lr = strategy.current_lr()
            telemetry.begin_step()
            if replicas is not None:
                replicas.start_step(state)  # the step's quorum; a healing group takes a live group's state here
            loss = train_step(model, strategy, source, state, cfg, env, device, telemetry.timer, watchdog.mark,
                              prefetcher, stability.z, tokens, step_settings)
            watchdog.mark()
            interval.add(loss)
            ckpt.ready_for_update()  # an asynchronous save's copy of the state, overlapping this step, is done
            grad_norm = strategy.optimizer_step(stability.check(loss, state.step + 1))
            telemetry.end_step()
            if replicas is not None:
                if not replicas.committed:  # a group was lost mid-all-reduce: this group trains the step again
                    continue
                replicas.step_done(state)
            state.step += 1
            state.samples += global_batch
            tokens.step_done()  # state.tokens is settled where it is read: a log step, a save
            gc_control.step(state.step)
            if check_early:  # its time is left out of the row's throughput, as validation's is
                check_early = False
                metrics.exclude(verify_round_trip(strategy.model, strategy.optimizer, run_dir, env.is_main, ckpt.group))
            logged: float | None = None
            # Before the stop agreement: a signal that comes during validation stops at this step, as always.
            val = validate(validator, model, watchdog, metrics) if validator.due(state.step) else {}
            if state.step % t.log_every == 0 or state.step in (1, t.max_steps) or val:
                sync_count.busy("log")  # the step's values are read here, once the device has caught up
                state.tokens += tokens.settle()
                logged, loss_avg = interval.take(loss)
                losses[state.step] = logged
                metrics.log(state.step, state.tokens,
                            {**telemetry.collect(state.step, strategy), **data_progress(source, state.samples),
                             **moe_fields(model, cfg.model, device)},
                            loss=logged, loss_avg=loss_avg, lr=lr, grad_norm=float(grad_norm),
                            **stability.log_fields(state.step, logged), **val)
            metrics.tick(state.step, logged)
            if val and trial is not None and trial.report(state.step, val):
                outcome = trial.pruned_outcome(state.step)
                break
            stop = state.step < t.max_steps and watcher.stop_requested(state.step, stability.wanted())
            if replicas is not None and state.step < t.max_steps:
                stop = replicas.agree_stop(watcher)  # every group asked: together; some: alone after a short wait
            # Trouble (train/stability): agreed with the stop, or at the end from every verdict; before any save.
            action = watcher.trouble if state.step < t.max_steps else stability.wanted(drain=True)
            action = max(action, stability.replicas_agree(state.step))  # collective where due; corruption wins
            if not action and (stop or state.step >= t.max_steps or (t.ckpt_every and state.step % t.ckpt_every == 0)):
                sync_count.busy("save")
                action = stability.before_save()
            if action != NOTHING:
                sync_count.busy("recover")
                state.tokens += tokens.settle()  # every rank: the action is agreed
                if prefetcher is not None:
                    prefetcher.close()
                recovered = stability.recover(action, state.step)
                if isinstance(recovered, StopOutcome):
                    outcome = recovered
                    break
                state = resumed_state(recovered)
                metrics.rewind(state.step, state.tokens)
                interval = IntervalLoss(state.loss_sum, state.loss_steps)
                prefetcher = start_prefetch(source, state, cfg, strategy, device, stability)
                if not stop:
                    watchdog.step_finished(state.step)
                    continue
            watchdog.step_finished(state.step)
            if state.step == 1:
                # Well behind the watchdog, so that a hang ends in stack dumps rather than a collective's error.
                distributed.set_collective_timeout(1.5 * max(watchdog.timeout("step"), watchdog.timeout("checkpoint"))
                                                   + 60)
            if state.step >= t.max_steps:
                break
            if stop:
                if prefetcher is not None:  # its thread would only compete with the save for the CPU
                    log.info("stopping at step %d: dropped %s prepared ahead; the resume starts at sample %d",
                             state.step, describe_dropped(prefetcher.close()), state.samples)
                carry(state, interval, tokens)
                with watchdog.section("checkpoint"):
                    ckpt.save(state, blocking=True)
                outcome = after_stop(env, cfg, state.step, watcher.agreed, run_dir)
                outcome = outcome if replicas is None else replicas.stopped(outcome)  # a lone group: restarted locally
                break
            if t.ckpt_every and state.step % t.ckpt_every == 0:
                carry(state, interval, tokens)
                with watchdog.section("checkpoint"):
                    ckpt.save(state, blocking=False)
                watchdog.save_state()
            ckpt.poll()
        else:
            if env.is_main:
                log.info("nothing to do: already at step %d of %d", state.step, t.max_steps)
        if state.step >= t.max_steps and outcome.kind is None:
            carry(state, interval, tokens)
            with watchdog.section("checkpoint"):
                ckpt.save(state, blocking=True)
            if env.is_main:
                log.info("finished at step %d (%d %stokens)", state.step, state.tokens, "response " if responses else "")
        ckpt.close()
        watchdog.save_state()
    finally:
        if replicas is not None:
            replicas.close()
        gc_control.close()
        if prefetcher is not None:  # first: what it prepared past a stop is dropped; resume reads state.samples
            prefetcher.close()
        telemetry.close()
        metrics.close()
        if own_watchdog:
            watchdog.close()
    # checkpoint.export_hf: rank 0, after the final save and off the loop (nothing waits on it)
    export_at_end(cfg, env, run_dir, state.step, finished=state.step >= t.max_steps and outcome.kind is None)
    return TrainResult(state, model, losses, outcome)


def carry(state: TrainState, interval: IntervalLoss, tokens: TokenCount) -> None:
    """Before a save (every rank, at the same step): the interval's loss and the tokens trained into `state`."""
    interval.carry(state)
    state.tokens += tokens.settle()


def validate(validator: Validator, model: torch.nn.Module, watchdog: Watchdog,
             metrics: MetricsLogger) -> dict[str, float]:
    """One validation pass in its own watchdog section; its time is left out of the logged throughput."""
    sync_count.busy("validation")
    started = time.perf_counter()
    with watchdog.section("validation"):
        values = validator.run(model)
    metrics.exclude(time.perf_counter() - started)
    log.info("validation: %s", " ".join(f"{k} {v:.4f}" for k, v in values.items()))
    return values


def layout_line(layout: Any, hosts: list[str]) -> str:
    """Where every rank landed: its host and (data-parallel, stage, tensor-parallel) coordinates."""
    mp, cp = layout.tp * layout.pp, getattr(layout, "cp", 1)
    ranks = [f"rank {r} {host} (dp {r // (mp * cp)}, " + (f"cp {(r // mp) % cp}, " if cp > 1 else "")
             + f"stage {(r // layout.tp) % layout.pp}, tp {r % layout.tp})" for r, host in enumerate(hosts)]
    return f"tp {layout.tp} x pp {layout.pp} x " + (f"cp {cp} x " if cp > 1 else "") + f"dp {layout.dp}: " \
        + "; ".join(ranks)


def start_prefetch(source: TokenSource, state: TrainState, cfg: Any, strategy: Strategy,
                   device: torch.device, stability: Stability | None = None) -> BatchPrefetcher | None:
    """A worker thread preparing the micro batches of the next trainer.prefetch_steps steps (None: 0, or
    nothing left to train). A config.yaml written before the key existed prefetches at the default. With skipped
    sample ranges (contract/rundir/skipped_samples.py) the plan steps over them as the loop does."""
    t = cfg.trainer
    steps_ahead = int(t.get("prefetch_steps", TrainerConfig.prefetch_steps))
    if steps_ahead == 0 or state.step >= t.max_steps or strategy.pipeline is not None:
        return None  # a pipeline stage loads a whole step at once (pipeline_step)
    if strategy.replicas is not None:
        return None  # a heal moves the data position at a quorum: each step loads its own
    steps = t.max_steps - state.step
    plan: Iterator[range]
    if stability is not None and stability.skips.ranges:
        plan = (idx for start in stability.skips.starts(state.samples, steps, stability.global_batch)
                for idx in planned_micro_batches(start, 1, t.grad_accum_steps, strategy.dp_rank, strategy.dp_size,
                                                 t.micro_batch_size))
    else:
        plan = planned_micro_batches(state.samples, steps, t.grad_accum_steps, strategy.dp_rank, strategy.dp_size,
                                     t.micro_batch_size)
    return BatchPrefetcher(source, device, plan, depth=steps_ahead * t.grad_accum_steps,
                           documents=bool(cfg.data.get("document_mask", False)))


def _plain(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
