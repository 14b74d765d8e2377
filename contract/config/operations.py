"""How a run is operated: run directory, checkpoints, local workers, logging, launcher, telemetry,
watchdog, profiling, cluster, evaluation, stability.
Declared once; the whole config is contract/config/schema.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from contract.config.keys import num, path_key


@dataclass
class RunConfig:
    # Where run directories are made: RUN_ROOT/RUN_NAME (relative to the launching directory).
    root: str = path_key("outputs")
    # None: derived from the config (model, strategy, precision and a hash of the training settings), so the
    # same command lands in the same run directory.
    name: str | None = None
    # Continue from the newest complete checkpoint of this run directory (a requeue does the same).
    resume: bool = True
    # With resume=false on a directory that has checkpoints: delete them and start over (never implicit).
    overwrite: bool = False


@dataclass
class CheckpointConfig:
    # Keep the newest N complete checkpoints ...
    keep_last: int = num(3, 1)
    # ... plus every checkpoint whose step is a multiple of this (0: none).
    keep_every: int = num(0, 0)
    # ... plus the one that measured best by this metric (contract/rules/keep_best.py): val/NAME/loss, val/NAME/ppl or
    # harness/TASK/METRIC, its direction from its name (METRIC:max or :min says it). None: off.
    keep_best: str | None = None
    # Periodic saves write in the background (DCP async_save); the preemption and final saves are synchronous.
    async_save: bool = True
    # Before resuming: check every file's size against the checkpoint's manifest ("size"), or also its CRC-32
    # ("full"). A checkpoint that fails is moved to checkpoints/quarantine/ and the previous one is used.
    verify: str = "size"
    # The first attempt writes one checkpoint after step 1, reads it back into a scratch copy of the state and
    # compares it bit for bit, then deletes it: a broken filesystem, a permission or quota problem or a state that
    # does not round-trip stops the run at once, named (contract/rules/verify_early.py). None: on for SLURM runs.
    verify_early: bool | None = None
    # At the end of training, rank 0 writes the final checkpoint as a verified Hugging Face directory (what
    # `python -m launcher.export RUN --format hf` writes) to RUN/export/hf_step_N; launcher.status names it.
    export_hf: bool = False


@dataclass
class LocalConfig:
    # Worker processes in local mode; None: the number of local GPUs, else 1.
    nproc: int | None = num(None, 1)
    # gloo on CPU, nccl with GPUs; None picks.
    backend: str | None = None


@dataclass
class LoggerConfig:
    # wandb | tensorboard (RUN_DIR/tensorboard/) | none, or both as a list: logger.backend=[wandb,tensorboard]
    # (contract/rules/log_backends.py). metrics.jsonl is written whatever this says.
    backend: Any = "wandb"
    # wandb's: offline by default, nothing leaves the machine unless the user opts in.
    mode: str = "offline"  # offline | online | disabled
    # wandb's project.
    project: str = "slurmtrain"
    # wandb's entity (a user or team); None: the default of the account.
    entity: str | None = None
    # wandb run group; a sweep sets it to the sweep name so its points show together.
    group: str | None = None


@dataclass
class LauncherConfig:
    # Print the plan and the sbatch script, submit nothing.
    dry_run: bool = False
    # Follow a submitted job until it ends and exit with its result.
    wait: bool = False
    # Inside an sbatch allocation (sbatch/*.sbatch): write the run directory for SLURM_NTASKS ranks, print the
    # config path and exit; the script then runs `srun python -m launcher.worker --config PATH`.
    prepare_only: bool = False
    # `-m` sweeps: the sweep's name (its directory under run.root/sweeps/ and the wandb group); None: derived
    # from the sweep's overrides, so the same sweep command finds the same sweep again (and resumes it).
    sweep_name: str | None = None
    # Run even if the memory estimate says the job does not fit.
    force: bool = False
    # Added to the estimate per rank: the CUDA context and allocator (or the Python runtime on CPU) ...
    memory_margin_gb: float = num(1.0, 0)
    # ... plus this fraction of the estimate for fragmentation.
    memory_fragmentation: float = num(0.1, 0)


@dataclass
class TelemetryConfig:
    # Step time per rank, data wait, achieved TFLOP/s and MFU, peak memory, per-node throughput, stragglers.
    enabled: bool = True
    # A rank is a straggler when its step time exceeds the median across ranks by this factor ...
    straggler_factor: float = num(1.5, 1, lo_open=True)
    # ... for this many log intervals in a row.
    straggler_intervals: int = num(3, 1)
    # Dense peak TFLOP/s of one local device for MFU in local runs (a cluster's comes from cluster.peak_tflops).
    peak_tflops: float | None = num(None, 0, lo_open=True)


@dataclass
class WatchdogConfig:
    # A thread on every rank (train/faults/watchdog.py): a section that overruns its timeout dumps every thread's stack
    # into RUN_DIR/hangs/ and ends the rank, instead of a dead collective burning the allocation.
    enabled: bool = True
    # Process start through the end of the first step (imports, rendezvous, checkpoint load, compile).
    startup_timeout_s: float = num(1800.0, 0, lo_open=True)
    # None: learned, factor x the longest seen so far (at least min_timeout_s), kept for the next attempt.
    step_timeout_s: float | None = num(None, 0, lo_open=True)
    # A save's blocking part; None: learned as step_timeout_s is.
    checkpoint_timeout_s: float | None = num(None, 0, lo_open=True)
    # A learned timeout is this many times the longest duration seen so far ...
    factor: float = num(5.0, 1)
    # ... and at least this long.
    min_timeout_s: float = num(300.0, 0, lo_open=True)


@dataclass
class ProfileConfig:
    # `+profile=default`: torch.profiler on these ranks with a wait / warmup / active schedule (in steps).
    ranks: list[int] = field(default_factory=lambda: [0], metadata={"range": (0, None, False, False)})
    # Steps before profiling starts.
    wait: int = num(5, 0)
    # Steps profiled but discarded, to warm the profiler up.
    warmup: int = num(2, 0)
    # Steps recorded.
    active: int = num(3, 1)
    # How many wait / warmup / active cycles (0: until the run ends).
    repeat: int = num(1, 0)
    # How many of the most expensive operators to print at the end.
    top_ops: int = num(15, 1)


@dataclass
class ClusterConfig:
    # The cluster's name: set by the group option (+cluster=local_slurm), never typed.
    name: str = MISSING
    # Nodes per job.
    nodes: int = num(1, 1)
    # GPUs per node (0: a CPU cluster, one rank per task).
    gpus_per_node: int = num(0, 0)
    # Tasks (ranks) per node: one per GPU, or this many on a CPU cluster.
    tasks_per_node: int | None = num(None, 1)
    # The GPU's name (H100, A100), shown in the plan's memory line.
    gpu_type: str | None = None
    # Memory per GPU, which the plan's memory estimate must fit in (0: not checked).
    gpu_memory_gb: float = num(0.0, 0)
    # Dense peak TFLOP/s per GPU, keyed by precision name (bf16, fp16, fp32).
    peak_tflops: dict[str, float] = field(default_factory=dict, metadata={"range": (0, None, True, False)})
    # sbatch --partition; None: the cluster's default.
    partition: str | None = None
    # sbatch --account.
    account: str | None = None
    # sbatch --qos.
    qos: str | None = None
    # sbatch --time, in minutes: a job's allocation, after which it checkpoints and requeues.
    time_limit_min: int = num(60, 1)
    # sbatch --cpus-per-task.
    cpus_per_task: int = num(1, 1)
    # Memory per task: sbatch --mem is this times the tasks per node; None: the partition's default.
    mem_per_task_gb: float | None = num(None, 0, lo_open=True)
    # sbatch --constraint (node features).
    constraint: str | None = None
    # sbatch --exclusive: whole nodes, shared with no other job.
    exclusive: bool = False
    # torch.distributed backend: nccl (GPUs) or gloo (CPUs).
    backend: str = "nccl"
    # Shell lines the sbatch script runs before the ranks start (module load, source a venv).
    setup: list[str] = field(default_factory=list)
    # Environment variables exported in the sbatch script (e.g. NCCL settings).
    env: dict[str, str] = field(default_factory=dict)
    # The signal SLURM sends before the time limit (sbatch --signal); the ranks checkpoint and requeue on it.
    signal: str = "USR1"
    # ... this many seconds before the time limit.
    signal_lead_s: int = num(90, 1, 65535)
    # srun starts one task per rank. torchrun under srun is refused: its agent dies on the preemption signal.
    launch: str = "srun"
    # Requeues after a preemption or the time limit over a job's life (submitit's max_num_timeout).
    max_requeues: int = num(3, 0)
    # Unexpected failures (a crashed rank, a hang) requeue the job this many times over the run's life; the
    # failed host is left out when the partition has nodes to spare. Configuration errors are never retried.
    max_failures: int = num(3, 0)
    # NCCL's own failure handling (torch's TORCH_NCCL_* variables, set on the ranks unless cluster.env sets them):
    # abort communicators on an error or timeout, a heartbeat monitor that ends a rank whose NCCL watchdog is stuck,
    # and the flight recorder (this many entries; 0: off), dumped into RUN_DIR/hangs/ on a timeout.
    nccl_async_error_handling: int = num(3, 0, 3)
    # The NCCL heartbeat monitor's timeout.
    nccl_heartbeat_timeout_s: int = num(600, 1)
    # The NCCL flight recorder's entries (0: off).
    nccl_flight_recorder_entries: int = num(2000, 0)
    # `-m` sweeps: at most this many array tasks run at once (sbatch --array=0-N%THIS).
    array_parallelism: int = num(256, 1)
    # For the plan's cost estimate; None: no cost shown.
    price_per_gpu_hour: float | None = num(None, 0)
    # Model FLOPs utilisation assumed for the plan's step time, wall time and GPU-hours.
    assumed_mfu: float = num(0.4, 0, 1, lo_open=True)
    # Any other sbatch parameters, passed to sbatch as they are (name: value).
    extra_sbatch: dict[str, Any] = field(default_factory=dict)


@dataclass
class HarnessConfig:
    # lm-evaluation-harness tasks (a task, group or tag name lm_eval knows, or one of eval.harness.include_path's
    # YAMLs) scored wherever validation runs: in the loop (eval.every), evaluation jobs, launcher.evaluate
    # (contract/rules/harness.py, train/evaluation/harness.py). Each must read local files only (checked at launch).
    tasks: list[str] = field(default_factory=list)
    # Few-shot examples per prompt; None: each task's own default.
    num_fewshot: int | None = num(None, 0)
    # Documents per task: a count (1 or more), or a fraction of each task's documents below 1; None: all of them.
    limit: float | None = num(None, 0, lo_open=True)
    # Requests per forward pass on each data-parallel rank.
    batch_size: int = num(8, 1)
    # A directory of task YAMLs of your own (lm_eval's include_path), searched before lm_eval's own tasks.
    include_path: str | None = path_key(None)


@dataclass
class EvalConfig:
    # Validation during training (train/evaluation/): every this many steps and at the end; 0: off. Not a
    # training setting (validation never changes what is trained), so not part of the derived run name.
    every: int = num(0, 0)
    # Batches of trainer.global_batch_size samples per set: the same samples every time, on any world size.
    batches: int = num(4, 1)
    # Also evaluate the initial weights, at step 0.
    at_start: bool = False
    # Named sets, eval.sets.NAME.kind=val|tokens|synthetic|dataset (contract/rules/eval_sets.py); none named: one
    # set "val", the prepared data's validation split or the synthetic stream's held-out samples.
    sets: dict[str, Any] = path_key(each="path")
    # Evaluate each checkpoint (every trainer.ckpt_every steps, and the last) in a SLURM job of its own instead of in
    # the loop (contract/rules/eval_jobs.py, train/evaluation/job.py); needs +cluster. Training never waits for it. The
    # job's resources; None: the cluster's (ranks per node, partition, qos, time limit).
    async_jobs: bool = False
    # eval.async_jobs: nodes per evaluation job.
    job_nodes: int = num(1, 1)
    # eval.async_jobs: ranks per node (None: the cluster's).
    job_tasks_per_node: int | None = num(None, 1)
    # eval.async_jobs: the partition (None: the cluster's).
    job_partition: str | None = None
    # eval.async_jobs: the qos (None: the cluster's).
    job_qos: str | None = None
    # eval.async_jobs: the time limit in minutes (None: the cluster's).
    job_time_limit_min: int | None = num(None, 1)
    # Downstream scores beside the validation losses (lm-evaluation-harness): eval.harness.tasks=[...].
    harness: HarnessConfig = field(default_factory=HarnessConfig)


@dataclass
class StabilityConfig:
    # Checks on the device before every optimizer update (train/stability/): a step whose gradient norm is not finite
    # (or that the spike rule flags) is not applied, with no host synchronisation. false: no checks (benchmarks).
    enabled: bool = True
    # What follows a non-finite step: skip (count it and go on; after skip_limit skipped steps in a row, roll back),
    # rollback (at once: reload the newest complete checkpoint before it and skip its samples) or stop (checkpoint
    # nothing new, end naming the step and the last good checkpoint).
    nonfinite: str = "skip"
    # stability.nonfinite=skip: this many skipped steps in a row roll back.
    skip_limit: int = num(3, 1)
    # Roll back at most this many times over the run's life; the next trouble stops the run.
    max_rollbacks: int = num(3, 0)
    # A rollback skips the samples of the steps that went wrong and of this many steps before and after them.
    skip_margin_steps: int = num(0, 0)
    # The spike rule (OLMo-core): skip a step whose loss or gradient norm is more than spike_sigma standard deviations
    # above the mean of the last spike_window steps (checked once half the window is filled). 0: off.
    spike_sigma: float = num(0.0, 0)
    # The spike rule's window of recent steps.
    spike_window: int = num(128, 2)
    # Replica consistency (train/stability/replicas.py): every this many steps, and before every save, the ranks that
    # should hold identical weights (DDP, HSDP replicas, ZeRO-1/2) compare an exact fingerprint of them; a rank that
    # disagrees with the majority is silent data corruption: the run rolls back to the newest checkpoint verified
    # consistent (under SLURM: requeued without that host). 0: off (then no checkpoint is verified).
    replica_check_every: int = num(200, 0)
    # A loss more than this many nats above the best the run reached has blown up (contract/rules/blowup.py; the
    # references are capped at ln(vocab), a random model's loss): its checkpoint is no rollback target and not "good"
    # in the stop line. Above the run's start by as much, the stop line cuts the rate 10x or more and launcher.status
    # flags the run. 2.3 = ln 10: a perplexity ten times the reference's, for any vocabulary.
    blowup_margin: float = num(2.3, 0, lo_open=True)
