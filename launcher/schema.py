"""The one source of truth for every config key.

Every YAML file under conf/ only sets values declared here; Hydra validates keys and types at compose time
because the dataclasses below are registered in its ConfigStore and named in each file's defaults list.
This module imports nothing heavy: the launcher must stay torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

# Seeds go to torch, numpy and Python's random alike; numpy takes 32 bits.
SEED_MAX = 2**32 - 1


def num(default: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
        hi_open: bool = False) -> Any:
    """A numeric key and its valid range ([lo, hi], an end excluded when *_open), checked at launch for every
    key by launcher/checks/key_checks.py: a bad value is refused with its range before anything runs."""
    return field(default=default, metadata={"range": (lo, hi, lo_open, hi_open)})


def path_key(default: str | None = None, *, each: str = "") -> Any:
    """A key naming a file, a directory or a glob (each="path": a dict whose every entry names one under that key,
    data.sources.NAME.path). Made absolute at launch, `~` expanded, against the directory the launcher runs in
    (launcher/plan/paths.py): config.yaml holds absolute paths that the ranks, evaluation jobs, launcher.sample and
    export read from any directory, and the derived run name hashes them."""
    if each:
        return field(default_factory=dict, metadata={"path": each})
    return field(default=default, metadata={"path": ""})


@dataclass
class ModelConfig:
    name: str = MISSING
    vocab_size: int = num(256, 1)
    d_model: int = num(64, 1)
    n_layers: int = num(2, 1)
    n_heads: int = num(4, 1)
    # Grouped-query attention: fewer key/value heads than query heads (Llama 3); None means n_heads.
    n_kv_heads: int | None = num(None, 1)
    ffn_hidden: int = num(256, 1)
    max_seq_len: int = num(64, 1)
    # The two families we size: GPT-2 (learned positions, GELU MLP, LayerNorm, tied embeddings) and
    # Llama 3 (RoPE, SwiGLU, RMSNorm). One implementation, switched by these three keys.
    position: str = "rope"  # rope | learned
    mlp: str = "swiglu"  # swiglu | gelu
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    rope_theta: float = num(10000.0, 0, lo_open=True)
    tie_embeddings: bool = True
    dropout: float = num(0.0, 0, 1, hi_open=True)
    init_std: float = num(0.02, 0, lo_open=True)
    # Bring your own model: a function or class that returns an nn.Module, instantiated by Hydra with `args` as
    # its keyword arguments (model._target_=my_pkg.build_model model.args.hidden=128). The keys above then only
    # matter where the data uses them (vocab_size, max_seq_len). None: our transformer.
    _target_: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    # The repeated block that FSDP wraps and activation checkpointing recomputes: a class name (or
    # module.ClassName). None: found automatically (the longest list of identical blocks); "none": the model has
    # no blocks and is trained as one unit.
    block: str | None = None
    # model=hf_causal_lm: a local Hugging Face config.json (or the directory holding it); nothing is downloaded.
    config_path: str | None = path_key()
    # Start from saved weights (fine-tuning, continued pretraining): a safetensors file or directory, a Hugging Face
    # model directory, a run directory (its newest complete checkpoint) or RUN/checkpoints/step_N. Only the weights:
    # the optimizer, schedule and data start fresh; applied at a run's first start only (train/init_weights.py).
    init_from: str | None = path_key()


@dataclass
class DataConfig:
    name: str = MISSING
    # Tokens per sample; defaults to the model's context length.
    seq_len: int = num("${model.max_seq_len}", 1)  # type: ignore[assignment]
    seed: int = num("${trainer.seed}", 0, SEED_MAX)  # type: ignore[assignment]
    # synthetic: probability that the next token follows the hidden transition table (the learnable part).
    signal: float = num(0.9, 0, 1)
    # tokens: a flat binary file of token ids (numpy memmap), a prepared directory (python -m launcher.prepare; its
    # manifest sets the dtype and the vocabulary) or a glob of token files read as one stream.
    path: str | None = path_key()
    dtype: str = "uint16"
    shuffle: bool = True
    # tokens: a mixture instead of one path, data.sources.NAME.path=... data.sources.NAME.weight=0.7 (train/data/
    # mixture.py): which source and window a sample reads is a pure function of its index, the weights and the seed.
    sources: dict[str, Any] = path_key(each="path")
    # A checkpoint records the fingerprint of the data it was trained on; resuming on other data (another file,
    # changed contents, other sources or weights) is refused unless this is true. Not a training setting.
    allow_changed: bool = False
    # Bring your own data: a map-style dataset class (len and getitem) or a function returning one, instantiated
    # by Hydra with `args`. An item is a token sequence of seq_len + 1 (inputs and shifted targets), an
    # (inputs, targets) pair, or a dict with input_ids (and labels). Sample i of the global stream is item
    # i mod len, in an order shuffled per epoch by data.seed when data.shuffle is true.
    _target_: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = num(3e-3, 0, lo_open=True)
    min_lr_ratio: float = num(0.1, 0, 1)
    weight_decay: float = num(0.1, 0)
    beta1: float = num(0.9, 0, 1, hi_open=True)
    beta2: float = num(0.95, 0, 1, hi_open=True)
    eps: float = num(1e-8, 0, lo_open=True)
    warmup_steps: int = num(5, 0)
    # The learning-rate schedule after warmup (train/schedules.py has each closed form): cosine | linear | constant
    # | wsd (warmup-stable-decay) | inverse_sqrt. min_lr_ratio is the floor of all but constant.
    schedule: str = "cosine"
    # wsd: the decay takes this fraction of trainer.max_steps at the end, in this shape (1-sqrt | linear | cosine),
    # unless decay_start_step names the last step at the peak (like trainer.max_steps it may change when a run is
    # extended, so that a stable phase can be extended and annealed later).
    decay_fraction: float = num(0.2, 0, 1)
    decay_shape: str = "1-sqrt"
    decay_start_step: int | None = num(None, 0)
    # inverse_sqrt: the rate is 1/sqrt(2) of the peak this many steps after warmup (None: optim.warmup_steps).
    timescale: int | None = num(None, 1)
    grad_clip: float = num(1.0, 0)
    # Scale optim.lr with the effective batch: none, linear or sqrt of (global batch / reference_batch_size).
    lr_scaling: str = "none"
    reference_batch_size: int | None = num(None, 1)
    # Derived by the launch plan (optim.lr after lr_scaling); training uses it. Not set by hand.
    scaled_lr: float | None = num(None, 0, lo_open=True)
    # z-loss (PaLM, OLMo): this times the mean squared log-partition logsumexp(logits)^2 is added to the loss, keeping
    # the logits from drifting; logged as z_loss. 0: off. 1e-4 is the usual value.
    z_loss: float = num(0.0, 0)


@dataclass
class StrategyConfig:
    name: str = MISSING
    # Which backend implements it: torch (single, ddp, fsdp, fsdp_grad_op, hsdp) or deepspeed (zero*).
    backend: str = "torch"
    # DDP knobs.
    bucket_cap_mb: int = num(25, 1)
    gradient_as_bucket_view: bool = True
    # FSDP2 (fully_shard per transformer block): free the gathered parameters after forward (ZeRO-3 layout)
    # or keep them until backward (ZeRO-2 layout).
    reshard_after_forward: bool = True
    # HSDP: replicas across this many groups, sharded within each (None: the number of nodes).
    replicate_degree: int | None = num(None, 1)
    # DeepSpeed ZeRO.
    zero_stage: int = num(0, 0, 3)
    offload_optimizer: bool = False
    offload_params: bool = False
    # Across strategies: recompute each transformer block's activations in backward; torch.compile each block.
    activation_checkpointing: bool = False
    compile: bool = False


@dataclass
class ParallelConfig:
    # Tensor parallelism: each block's attention heads and MLP split over this many GPUs of one node (Megatron's
    # column / row pattern, sequence parallel norms). Data parallelism (strategy=fsdp/hsdp/ddp) is what is left:
    # world size / (tp x pp).
    tp: int = num(1, 1)
    # Pipeline parallelism: the blocks split evenly into this many stages, consecutive stages on consecutive nodes.
    pp: int = num(1, 1)
    # 1f1b | interleaved_1f1b; a step's accumulation steps are the pipeline's micro batches (at least 4 x pp).
    pp_schedule: str = "1f1b"
    # interleaved_1f1b: model chunks per pipeline rank.
    pp_virtual_stages: int = num(2, 1)
    # Tensor parallelism across nodes is refused (it collapses MFU over the network) unless this is set.
    allow_cross_node_tp: bool = False


@dataclass
class PrecisionConfig:
    name: str = MISSING
    # Dtype of the autocast region; fp32 means no autocast.
    compute_dtype: str = "float32"  # float32 | bfloat16 | float16


@dataclass
class TrainerConfig:
    max_steps: int = num(100, 1)
    micro_batch_size: int = num(8, 1)
    # None: derived from global_batch_size (or 1 when that is unset too).
    grad_accum_steps: int | None = num(None, 1)
    # Sequences per optimizer step across all ranks; None: micro x accumulation x data-parallel size.
    global_batch_size: int | None = num(None, 1)
    seed: int = num(1234, 0, SEED_MAX)
    log_every: int = num(10, 1)
    # Periodic (asynchronous) checkpoint interval in optimizer steps; 0: only on preemption and at the end.
    ckpt_every: int = num(100, 0)
    # Force the deterministic-algorithms switch of torch (bitwise-reproducible resume tests).
    deterministic: bool = True
    # Threads per rank for CPU math. Fixed (not derived from the host) so that the same seed gives the same
    # losses in local mode and under SLURM.
    cpu_threads: int = num(1, 1)
    # Optimizer steps of micro batches a background thread prepares ahead of training (0: load on the training
    # thread). Samples are addressed by index, so this never changes which samples a step trains on.
    prefetch_steps: int = num(2, 0, 64)
    progress_bar: bool = True


@dataclass
class RunConfig:
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
    # Periodic saves write in the background (DCP async_save); the preemption and final saves are synchronous.
    async_save: bool = True
    # Before resuming: check every file's size against the checkpoint's manifest ("size"), or also its CRC-32
    # ("full"). A checkpoint that fails is moved to checkpoints/quarantine/ and the previous one is used.
    verify: str = "size"


@dataclass
class LocalConfig:
    # Worker processes in local mode; None: the number of local GPUs, else 1.
    nproc: int | None = num(None, 1)
    # gloo on CPU, nccl with GPUs; None picks.
    backend: str | None = None


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | none
    # offline by default: nothing leaves the machine unless the user opts in.
    mode: str = "offline"  # offline | online | disabled
    project: str = "slurmtrain"
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
    # A thread on every rank (train/watchdog.py): a section that overruns its timeout dumps every thread's stack
    # into RUN_DIR/hangs/ and ends the rank, instead of a dead collective burning the allocation.
    enabled: bool = True
    # Process start through the end of the first step (imports, rendezvous, checkpoint load, compile).
    startup_timeout_s: float = num(1800.0, 0, lo_open=True)
    # None: learned, factor x the longest seen so far (at least min_timeout_s), kept for the next attempt.
    step_timeout_s: float | None = num(None, 0, lo_open=True)
    checkpoint_timeout_s: float | None = num(None, 0, lo_open=True)
    factor: float = num(5.0, 1)
    min_timeout_s: float = num(300.0, 0, lo_open=True)


@dataclass
class ProfileConfig:
    # `+profile=default`: torch.profiler on these ranks with a wait / warmup / active schedule (in steps).
    ranks: list[int] = field(default_factory=lambda: [0], metadata={"range": (0, None, False, False)})
    wait: int = num(5, 0)
    warmup: int = num(2, 0)
    active: int = num(3, 1)
    repeat: int = num(1, 0)
    # How many of the most expensive operators to print at the end.
    top_ops: int = num(15, 1)


@dataclass
class ClusterConfig:
    name: str = MISSING
    nodes: int = num(1, 1)
    gpus_per_node: int = num(0, 0)
    # Tasks (ranks) per node: one per GPU, or this many on a CPU cluster.
    tasks_per_node: int | None = num(None, 1)
    gpu_type: str | None = None
    gpu_memory_gb: float = num(0.0, 0)
    # Dense peak TFLOP/s per GPU, keyed by precision name (bf16, fp16, fp32).
    peak_tflops: dict[str, float] = field(default_factory=dict, metadata={"range": (0, None, True, False)})
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_min: int = num(60, 1)
    cpus_per_task: int = num(1, 1)
    mem_per_task_gb: float | None = num(None, 0, lo_open=True)
    constraint: str | None = None
    exclusive: bool = False
    backend: str = "nccl"
    setup: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    signal: str = "USR1"
    signal_lead_s: int = num(90, 1, 65535)
    # srun starts one task per rank. torchrun under srun is refused: its agent dies on the preemption signal.
    launch: str = "srun"
    max_requeues: int = num(3, 0)
    # Unexpected failures (a crashed rank, a hang) requeue the job this many times over the run's life; the
    # failed host is left out when the partition has nodes to spare. Configuration errors are never retried.
    max_failures: int = num(3, 0)
    # NCCL's own failure handling (torch's TORCH_NCCL_* variables, set on the ranks unless cluster.env sets them):
    # abort communicators on an error or timeout, a heartbeat monitor that ends a rank whose NCCL watchdog is stuck,
    # and the flight recorder (this many entries; 0: off), dumped into RUN_DIR/hangs/ on a timeout.
    nccl_async_error_handling: int = num(3, 0, 3)
    nccl_heartbeat_timeout_s: int = num(600, 1)
    nccl_flight_recorder_entries: int = num(2000, 0)
    # `-m` sweeps: at most this many array tasks run at once (sbatch --array=0-N%THIS).
    array_parallelism: int = num(256, 1)
    price_per_gpu_hour: float | None = num(None, 0)
    # Model FLOPs utilisation assumed for the plan's step time, wall time and GPU-hours.
    assumed_mfu: float = num(0.4, 0, 1, lo_open=True)
    extra_sbatch: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalConfig:
    # Validation during training (train/evaluation/): every this many steps and at the end; 0: off. Not a
    # training setting (validation never changes what is trained), so not part of the derived run name.
    every: int = num(0, 0)
    # Batches of trainer.global_batch_size samples per set: the same samples every time, on any world size.
    batches: int = num(4, 1)
    # Also evaluate the initial weights, at step 0.
    at_start: bool = False
    # Named sets, eval.sets.NAME.kind=val|tokens|synthetic|dataset (train/evaluation/sets.py); none named: one
    # set "val", the prepared data's validation split or the synthetic stream's held-out samples.
    sets: dict[str, Any] = path_key(each="path")
    # Evaluate each checkpoint (every trainer.ckpt_every steps, and the last) in a SLURM job of its own instead of in
    # the loop (launcher/run/eval_jobs.py, train/evaluation/job.py); needs +cluster. Training never waits for it. The
    # job's resources; None: the cluster's (ranks per node, partition, qos, time limit).
    async_jobs: bool = False
    job_nodes: int = num(1, 1)
    job_tasks_per_node: int | None = num(None, 1)
    job_partition: str | None = None
    job_qos: str | None = None
    job_time_limit_min: int | None = num(None, 1)


@dataclass
class StabilityConfig:
    # Checks on the device before every optimizer update (train/stability/): a step whose gradient norm is not finite
    # (or that the spike rule flags) is not applied, with no host synchronisation. false: no checks (benchmarks).
    enabled: bool = True
    # What follows a non-finite step: skip (count it and go on; after skip_limit skipped steps in a row, roll back),
    # rollback (at once: reload the newest complete checkpoint before it and skip its samples) or stop (checkpoint
    # nothing new, end naming the step and the last good checkpoint).
    nonfinite: str = "skip"
    skip_limit: int = num(3, 1)
    # Roll back at most this many times over the run's life; the next trouble stops the run.
    max_rollbacks: int = num(3, 0)
    # A rollback skips the samples of the steps that went wrong and of this many steps before and after them.
    skip_margin_steps: int = num(0, 0)
    # The spike rule (OLMo-core): skip a step whose loss or gradient norm is more than spike_sigma standard deviations
    # above the mean of the last spike_window steps (checked once half the window is filled). 0: off.
    spike_sigma: float = num(0.0, 0)
    spike_window: int = num(128, 2)
    # Replica consistency (train/stability/replicas.py): every this many steps, and before every save, the ranks that
    # should hold identical weights (DDP, HSDP replicas, ZeRO-1/2) compare an exact fingerprint of them; a rank that
    # disagrees with the majority is silent data corruption: the run rolls back to the newest checkpoint verified
    # consistent (under SLURM: requeued without that host). 0: off (then no checkpoint is verified).
    replica_check_every: int = num(200, 0)
    # A loss more than this many nats above the best the run reached has blown up (train/stability/blowup.py; the
    # references are capped at ln(vocab), a random model's loss): its checkpoint is no rollback target and not "good"
    # in the stop line. Above the run's start by as much, the stop line cuts the rate 10x or more and launcher.status
    # flags the run. 2.3 = ln 10: a perplexity ten times the reference's, for any vocabulary.
    blowup_margin: float = num(2.3, 0, lo_open=True)


@dataclass
class Config:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    strategy: StrategyConfig = MISSING
    precision: PrecisionConfig = MISSING
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    cluster: ClusterConfig | None = None
    profile: ProfileConfig | None = None


def register() -> None:
    from launcher.sweeps.sweep import register_launcher

    register_launcher()
    # The top-level schema types every group's node, so group files are validated without schemas of their own
    # (which would also show up as bogus choices in Hydra's "Available options" list).
    ConfigStore.instance().store(name="schema", node=Config)
    # Hydra closes every dict, so a new key needs `+`; data.sources.NAME.path=... is how a mixture is typed: the
    # data groups take this node (conf/data/*.yaml), whose sources dict is open.
    sources = OmegaConf.create({"sources": {}})
    OmegaConf.set_struct(sources.sources, False)
    ConfigStore.instance().store(group="slurmtrain", name="open_sources", node=sources)
    # eval.sets.NAME.kind=... likewise, without `+` (conf/config.yaml puts this node at eval).
    eval_sets = OmegaConf.create({"sets": {}})
    OmegaConf.set_struct(eval_sets.sets, False)
    ConfigStore.instance().store(group="slurmtrain", name="open_eval_sets", node=eval_sets)
