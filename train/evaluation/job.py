"""An evaluation job's rank (eval.async_jobs=true; the design: contract/rules/eval_jobs.py):

    python -m launcher.worker --evaluate RUN_DIR STEP

loads the model weights of STEP's checkpoint on this job's ranks and runs the in-loop Validator over the sets the run
names and its eval.harness.tasks, so the values are those an in-loop pass at that step gives. Only the weights are read, as model.init_from
reads them (train/weights/init_weights.py): into each rank's model before the strategy places it, forward only (no
optimizer: strategies' setup(train=False)), so a sharding strategy shards them and any number of ranks loads a
checkpoint of any strategy (DCP or DeepSpeed), never touching its optimizer state; the accumulation is re-derived
so that an evaluation batch is still trainer.global_batch_size samples. Rank 0 writes RUN_DIR/eval/step_N.json and then
removes the pending marker that kept the checkpoint from retention (contract/rundir/eval_results.py).

Preemption: the signal handler (installed first) only sets a flag; the ranks agree on it once the weights are
loaded. A preemption signal (cluster.signal) by then makes rank 0 requeue the job (up to cluster.max_requeues
times) and the requeued job evaluates from the start; a signal during the pass lets it finish and write its result,
which is what the job is for. SIGTERM (scancel) ends it without a result: the pending marker stays.

Once its result is written, the job applies retention (checkpoint.keep_last, keep_every) to the checkpoints no
evaluation awaits any more: the ones kept for it go once it is done, also after training has ended.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

# Fault injection for tests: "STEP" holds the first attempt of STEP's job after loading (announced by the file
# eval/step_N.held) until a signal arrives, so that a test can signal a job at a known point.
TEST_HOLD_ENV = "SLURMTRAIN_TEST_EVAL_HOLD"
HOLD_LIMIT_S = 300


def for_world(cfg: Any, world_size: int) -> None:
    """The accumulation that keeps an evaluation batch at trainer.global_batch_size samples on this world size."""
    from omegaconf import open_dict

    from contract.errors import ConfigError

    t = cfg.trainer
    with open_dict(cfg):  # forward only: whole sequences on each rank (a checkpoint loads onto any layout)
        cfg.parallel.cp = 1
        if world_size % (int(cfg.parallel.tp) * int(cfg.parallel.pp)):
            # Fewer ranks than the training's model shards (one process, say): the whole model on each rank.
            cfg.parallel.tp = cfg.parallel.pp = 1
        if world_size % int(cfg.parallel.get("ep", 1)):
            # Fewer ranks than the training's expert split (launcher.evaluate's one process): every expert on each
            # rank (it built expert groups over ranks that were not there).
            cfg.parallel.ep = 1
    dp = world_size // (int(cfg.parallel.tp) * int(cfg.parallel.pp))
    per_step = int(t.micro_batch_size) * dp
    if dp < 1 or int(t.global_batch_size) % per_step:
        raise ConfigError(f"an evaluation on {world_size} ranks can't split the global batch "
                          f"{t.global_batch_size} into micro batches of {t.micro_batch_size}: run it on a world size "
                          "whose data-parallel size divides it")
    with open_dict(cfg):
        t.grad_accum_steps = int(t.global_batch_size) // per_step


def run(run_dir: str | Path, step: int, config: str | Path | None = None) -> int:
    """`config`: launcher.evaluate's (the run's with its eval.* overrides); else the checkpoint's own."""
    run_dir = Path(run_dir).resolve()
    from contract.rundir import ckpt_layout as layout

    checkpoint = layout.CheckpointDir(step, layout.step_dir(run_dir, step))
    from train.entry import load_config

    if not checkpoint.complete:
        print(f"error: {checkpoint.path} is not a complete checkpoint (deleted, or never finished): nothing to "
              "evaluate", file=sys.stderr)
        return 2
    cfg = load_config(Path(config) if config else checkpoint.path / "config.yaml")  # what trained it, or asked
    from train.faults.signals import StopFlag, preempt_signal

    flag = StopFlag(preempt_signal(cfg))  # before the heavy imports
    import torch

    from contract.errors import EXIT_BAD_INPUT, ConfigError
    from train import distributed
    from train.observe.metrics import log, setup_logging

    env = distributed.detect()
    setup_logging(env)
    torch.set_num_threads(cfg.trainer.cpu_threads)
    backend = distributed.pick_backend(cfg.cluster.backend if cfg.cluster is not None else None)
    device = distributed.device_for(env, backend)
    try:
        distributed.init_process_group(env, backend, timeout_s=int(cfg.watchdog.startup_timeout_s))
        values, requeue_job = evaluate(cfg, env, device, run_dir, checkpoint, flag, always=config is not None)
    except ConfigError as err:
        log.error("error: %s", err)
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    finally:
        distributed.destroy_process_group()
        flag.close()
    if values is None:
        if requeue_job:
            from train.faults.preemption import requeue

            requeue(requeue_job)  # last: it ends this attempt
        return 0
    if env.is_main:
        from contract.rundir import eval_results
        from train.faults.preemption import slurm_job_id

        path = eval_results.write_result(run_dir, step, values, job=slurm_job_id(), world_size=env.world_size,
                                         checkpoint=str(checkpoint.path))
        eval_results.clear_pending(run_dir, step)
        # Retention's deletions that waited for this evaluation (training's next pass would do them, if it has one).
        from train.checkpoints.retention import doomed_checkpoints

        for doomed in doomed_checkpoints(run_dir, cfg.checkpoint):
            layout.remove(doomed)
        log.info("evaluation of step %d written to %s: %s", step, path,
                 " ".join(f"{k} {v:.4f}" for k, v in values.items()))
    return 0


def evaluate(cfg: Any, env: Any, device: Any, run_dir: Path, checkpoint: Any, flag: Any,
             always: bool = False) -> tuple[dict[str, float] | None, str | None]:
    """Every set's loss and perplexity and every harness task's scores; None when the job was asked to stop before
    the pass, with the job rank 0 requeues once everything is closed. `always`: launcher.evaluate's, whether or not
    the run validates."""
    from contract.rules.init_source import checkpoint_source
    from train.evaluation.validator import Validator
    from train.model.build import build_model
    from train.observe.metrics import log
    from train.strategies import build_strategy
    from train.weights.init_weights import load_into

    for_world(cfg, env.world_size)
    strategy = build_strategy(cfg, env, device)
    model = build_model(cfg.model)
    # The weights the training forward ran with (a ZeRO-1/2 checkpoint's module states, never its optimizer files).
    count = load_into(model, checkpoint_source(checkpoint.path, key="checkpoint"), cfg.model, master=False)
    model = strategy.setup(model, train=False)
    if env.is_main:
        log.info("evaluating step %d (%s, %d tensors of its weights) on %d ranks", checkpoint.step, checkpoint.path,
                 count, env.world_size)
    validator = Validator(cfg, strategy, device, always=always)
    _hold_for_test(env, run_dir, checkpoint.step, flag)
    stop, requeue_job = _agreed_stop(env, cfg, checkpoint.step, flag)
    return (None, requeue_job) if stop else (validator.run(model), None)


def _agreed_stop(env: Any, cfg: Any, step: int, flag: Any) -> tuple[bool, str | None]:
    """Collective: did any rank get a signal? With a preemption signal, rank 0 gets the job to requeue."""
    import torch

    from train.distributed import all_reduce_max, cpu_group
    from train.faults.preemption import NOTHING, REQUEUE, STOP, slurm_job_id
    from train.observe.metrics import log

    local = REQUEUE if flag.wants_requeue else STOP if flag.received is not None else NOTHING
    agreed = all_reduce_max(local, torch.device("cpu"), cpu_group())
    if agreed == NOTHING:
        return False, None
    job_id = slurm_job_id()
    if agreed == REQUEUE and job_id is not None and env.is_main:
        restarts, limit = int(os.environ.get("SLURM_RESTART_COUNT", "0")), int(cfg.cluster.max_requeues)
        if restarts >= limit:
            raise RuntimeError(f"evaluation of step {step}: job {job_id} was already requeued {restarts} times "
                               f"(cluster.max_requeues={limit}); not requeueing it again")
        log.info("got the preemption signal before evaluating step %d: requeueing job %s (restart %d of at most "
                 "%d)", step, job_id, restarts + 1, limit)
        return True, job_id
    if env.is_main:
        log.info("stopped before evaluating step %d: no result written", step)
    return True, None


def _hold_for_test(env: Any, run_dir: Path, step: int, flag: Any) -> None:
    if os.environ.get(TEST_HOLD_ENV) != str(step) or int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0:
        return
    from contract.rundir import eval_results

    if env.is_main:
        (eval_results.eval_dir(run_dir) / f"step_{step}.held").write_text(f"{os.environ.get('SLURM_JOB_ID')}\n")
    deadline = time.monotonic() + HOLD_LIMIT_S
    while flag.received is None and time.monotonic() < deadline:
        time.sleep(0.05)
