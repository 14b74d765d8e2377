"""What is trained and how: model, data, optimizer, strategy, parallelism, precision, trainer.
Declared once; the whole config is contract/config/schema.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from contract.config.keys import SEED_MAX, num, path_key


@dataclass
class MoEConfig:
    # Mixture of experts (train/model/moe.py): the MLP of a MoE layer is `num_experts` expert MLPs (each of
    # model.ffn_hidden, the model's mlp kind) and a router; 0: a dense model.
    num_experts: int = num(0, 0)
    # Experts each token is sent to (its router's top_k probabilities, renormalised to sum to 1, as Mixtral does).
    top_k: int = num(2, 1)
    # 0: dropless, every token reaches its top_k experts however uneven the load. > 0: each expert takes at most
    # ceil(capacity_factor x tokens x top_k / num_experts) of a rank's micro batch, in token order; the choices past
    # that are dropped (the token skips that expert; its residual stream carries on) and counted as dropped tokens.
    capacity_factor: float = num(0.0, 0)
    # Shared experts (DeepSeek-MoE): dense MLPs of model.ffn_hidden that every token passes through besides its routed
    # experts; 0: none.
    shared_experts: int = num(0, 0)
    # The load-balancing loss (Switch Transformer: num_experts x sum over experts of the fraction of routed tokens x
    # the mean router probability; 1 when balanced) times this is added to the training loss; 0: off.
    aux_loss_coef: float = num(0.01, 0)
    # The router z-loss (ST-MoE: the mean squared logsumexp of the router logits) times this is added too; 0: off.
    z_loss_coef: float = num(0.001, 0)
    # Which layers are MoE: every `every`-th (layers every-1, 2 x every-1, ...); 1: all of them, the others dense.
    every: int = num(1, 1)


@dataclass
class ModelConfig:
    # The model's name: set by the group option (model=tiny), never typed.
    name: str = MISSING
    # Token ids the embedding holds; with data=tokens, at least the prepared data's vocabulary (a launch says which).
    vocab_size: int = num(256, 1)
    # Hidden size: the width of the residual stream.
    d_model: int = num(64, 1)
    # Transformer blocks.
    n_layers: int = num(2, 1)
    # Query heads per attention layer (d_model must divide by it).
    n_heads: int = num(4, 1)
    # Grouped-query attention: fewer key/value heads than query heads (Llama 3); None means n_heads.
    n_kv_heads: int | None = num(None, 1)
    # The MLP's inner width.
    ffn_hidden: int = num(256, 1)
    # Context length: the longest sequence the model takes (data.seq_len's default).
    max_seq_len: int = num(64, 1)
    # The two families we size: GPT-2 (learned positions, GELU MLP, LayerNorm, tied embeddings) and
    # Llama 3 (RoPE, SwiGLU, RMSNorm). One implementation, switched by these three keys.
    position: str = "rope"  # rope | learned
    mlp: str = "swiglu"  # swiglu | gelu
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    # The norms' epsilon: 1e-5 in Llama 3 and GPT-2 (Hugging Face's LlamaConfig defaults to 1e-6).
    norm_eps: float = num(1e-5, 0, lo_open=True)
    # position=rope: the rotary embeddings' base frequency.
    rope_theta: float = num(10000.0, 0, lo_open=True)
    # The output layer shares the input embedding's weights (GPT-2); false: a layer of its own.
    tie_embeddings: bool = True
    # Attention dropout probability while training (scaled_dot_product_attention's dropout_p).
    dropout: float = num(0.0, 0, 1, hi_open=True)
    # Standard deviation of the normal initialisation of the weights.
    init_std: float = num(0.02, 0, lo_open=True)
    # Bring your own model: a function or class that returns an nn.Module, instantiated by Hydra with `args` as
    # its keyword arguments (model._target_=my_pkg.build_model model.args.hidden=128). The keys above then only
    # matter where the data uses them (vocab_size, max_seq_len). None: our transformer.
    _target_: str | None = None
    # Keyword arguments for model._target_.
    args: dict[str, Any] = field(default_factory=dict)
    # The repeated block that FSDP wraps and activation checkpointing recomputes: a class name (or
    # module.ClassName). None: found automatically (the longest list of identical blocks); "none": the model has
    # no blocks and is trained as one unit.
    block: str | None = None
    # model=hf_causal_lm: a local Hugging Face config.json (or the directory holding it); nothing is downloaded.
    config_path: str | None = path_key()
    # Start from saved weights (fine-tuning, continued pretraining): a safetensors file or directory, a Hugging Face
    # model directory, a run directory (its newest complete checkpoint) or RUN/checkpoints/step_N. Only the weights:
    # the optimizer, schedule and data start fresh; applied at a run's first start only (train/weights/init_weights.py).
    init_from: str | None = path_key()
    # Mixture of experts: model.moe.num_experts > 0 (conf/model/moe_tiny.yaml, mixtral_8x7b.yaml).
    moe: MoEConfig = field(default_factory=MoEConfig)


@dataclass
class DataConfig:
    # The data source: set by the group option (data=synthetic | tokens), never typed.
    name: str = MISSING
    # Tokens per sample; defaults to the model's context length.
    seq_len: int = num("${model.max_seq_len}", 1)  # type: ignore[assignment]
    # Seeds the data order (the shuffle of each epoch, a mixture's choice of source); defaults to trainer.seed.
    seed: int = num("${trainer.seed}", 0, SEED_MAX)  # type: ignore[assignment]
    # synthetic: probability that the next token follows the hidden transition table (the learnable part).
    signal: float = num(0.9, 0, 1)
    # tokens: a flat binary file of token ids (numpy memmap), a prepared directory (python -m launcher.prepare; its
    # manifest sets the dtype and the vocabulary) or a glob of token files read as one stream.
    path: str | None = path_key()
    # tokens: the dtype of a raw token file (a prepared directory's manifest gives its own).
    dtype: str = "uint16"
    # Read samples in an order shuffled per epoch by data.seed; false: in file order.
    shuffle: bool = True
    # tokens, supervised fine-tuning data (launcher.prepare --prompt-field/--response-field or --messages-field):
    # packed, records one after another in windows of seq_len + 1 as text is (no padding wasted); padded, one record
    # a sample, padded to seq_len (a longer record is cut). Only response tokens count either way.
    sft_layout: str = "packed"
    # tokens: a mixture instead of one path, data.sources.NAME.path=... data.sources.NAME.weight=0.7 (train/data/
    # mixture.py): which source and window a sample reads is a pure function of its index, the weights and the seed.
    sources: dict[str, Any] = path_key(each="path")
    # A checkpoint records the fingerprint of the data it was trained on; resuming on other data (another file,
    # changed contents, other sources or weights) is refused unless this is true. Not a training setting.
    allow_changed: bool = False
    # Attention stays within each document of a packed sample (block-causal) and positions (RoPE or learned)
    # restart at each document, the documents being those a prepared dataset records (its end-of-document ids,
    # which only the preparation writes). Flex attention on GPUs, a dense boolean mask on CPUs; the plan says which.
    # Needs data=tokens on prepared directories and slurmtrain's transformer (contract/rules/document_mask.py).
    document_mask: bool = False
    # Bring your own data: a map-style dataset class (len and getitem) or a function returning one, instantiated
    # by Hydra with `args`. An item is a token sequence of seq_len + 1 (inputs and shifted targets), an
    # (inputs, targets) pair, or a dict with input_ids (and labels). Sample i of the global stream is item
    # i mod len, in an order shuffled per epoch by data.seed when data.shuffle is true.
    _target_: str | None = None
    # Keyword arguments for data._target_.
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    # Which optimizer (the group option: optim=adamw | sgd | adafactor | muon | lion; contract/rules/optimizers.py).
    # The keys after weight_decay are each read by some of them only: set for another, a key is refused.
    name: str = "adamw"
    # Peak learning rate, reached after warmup (before optim.lr_scaling).
    lr: float = num(3e-3, 0, lo_open=True)
    # The schedule's floor as a fraction of the peak rate.
    min_lr_ratio: float = num(0.1, 0, 1)
    # Decoupled weight decay (AdamW's), applied to the parameters optim.no_decay does not skip.
    weight_decay: float = num(0.1, 0)
    # What weight decay skips: any of norm, bias, embedding (a table, and an output layer tied to it) and vector
    # (every parameter of fewer than 2 dims, the rule before this key); [] decays every parameter.
    no_decay: list[str] = field(default_factory=lambda: ["norm", "bias", "embedding"])
    # adamw, lion, and muon's AdamW part.
    beta1: float = num(0.9, 0, 1, hi_open=True)
    # adamw, lion, and muon's AdamW part: the second moment's decay (lion: the momentum update's).
    beta2: float = num(0.95, 0, 1, hi_open=True)
    # adamw and muon's AdamW part: added to the denominator.
    eps: float = num(1e-8, 0, lo_open=True)
    # sgd, muon: the momentum factor and Nesterov's variant (conf/optim/sgd.yaml, muon.yaml set them).
    momentum: float | None = num(None, 0, 1, hi_open=True)
    # sgd, muon: Nesterov momentum.
    nesterov: bool | None = None
    # muon: Newton-Schulz iterations orthogonalising each hidden matrix's update.
    ns_steps: int | None = num(None, 1, 99)
    # adafactor: the second moment's decay (beta2 at step t is 1 - t^beta2_decay) and the update's RMS clip (torch's d).
    beta2_decay: float | None = num(None, -1, 0)
    # adafactor: the update's RMS clip.
    clip_threshold: float | None = num(None, 0, lo_open=True)
    # Steps of linear warmup from 0 to the peak rate.
    warmup_steps: int = num(5, 0)
    # The learning-rate schedule after warmup (contract/rules/schedules.py has each closed form): cosine | linear | constant
    # | wsd (warmup-stable-decay) | inverse_sqrt. min_lr_ratio is the floor of all but constant.
    schedule: str = "cosine"
    # wsd: the decay takes this fraction of trainer.max_steps at the end, in this shape (1-sqrt | linear | cosine),
    # unless decay_start_step names the last step at the peak (like trainer.max_steps it may change when a run is
    # extended, so that a stable phase can be extended and annealed later).
    decay_fraction: float = num(0.2, 0, 1)
    # wsd: the decay's shape (1-sqrt | linear | cosine).
    decay_shape: str = "1-sqrt"
    # wsd: the last step at the peak rate (None: from optim.decay_fraction).
    decay_start_step: int | None = num(None, 0)
    # inverse_sqrt: the rate is 1/sqrt(2) of the peak this many steps after warmup (None: optim.warmup_steps).
    timescale: int | None = num(None, 1)
    # Clip the global gradient norm to this before each update; 0: no clipping.
    grad_clip: float = num(1.0, 0)
    # Scale optim.lr with the effective batch: none, linear or sqrt of (global batch / reference_batch_size).
    lr_scaling: str = "none"
    # optim.lr_scaling: the global batch size optim.lr was tuned for.
    reference_batch_size: int | None = num(None, 1)
    # Derived by the launch plan (optim.lr after lr_scaling); training uses it. Not set by hand.
    scaled_lr: float | None = num(None, 0, lo_open=True)
    # z-loss (PaLM, OLMo): this times the mean squared log-partition logsumexp(logits)^2 is added to the loss, keeping
    # the logits from drifting; logged as z_loss. 0: off. 1e-4 is the usual value.
    z_loss: float = num(0.0, 0)
    # Across replica groups (parallel.replica_groups > 1; docs/faults.md): none (the gradients averaged every step)
    # or diloco: each group steps this optimizer alone, and every optim.sync_every steps the groups average their
    # pseudo-gradients (the last global weights less their own) and apply them with Nesterov SGD.
    outer: str = "none"
    # diloco: the steps between two syncs (H); trainer.max_steps must be a multiple of it.
    sync_every: int = num(100, 1)
    # diloco: the outer SGD's learning rate (the DiLoCo paper's and torchft's 0.7).
    outer_lr: float = num(0.7, 0, lo_open=True)
    # diloco: the outer SGD's momentum (0.9).
    outer_momentum: float = num(0.9, 0, 1, hi_open=True)
    # diloco: the outer SGD's Nesterov momentum (on, as in the paper).
    outer_nesterov: bool = True


@dataclass
class StrategyConfig:
    # The strategy's name: set by the group option (strategy=ddp), never typed.
    name: str = MISSING
    # Which backend implements it: torch (single, ddp, fsdp, fsdp_grad_op, hsdp) or deepspeed (zero*).
    backend: str = "torch"
    # DDP knobs.
    bucket_cap_mb: int = num(25, 1)
    # DDP: gradients are views into the communication buckets (saves a copy).
    gradient_as_bucket_view: bool = True
    # FSDP2 (fully_shard per transformer block): free the gathered parameters after forward (ZeRO-3 layout)
    # or keep them until backward (ZeRO-2 layout).
    reshard_after_forward: bool = True
    # HSDP: replicas across this many groups, sharded within each (None: the number of nodes).
    replicate_degree: int | None = num(None, 1)
    # DeepSpeed ZeRO.
    zero_stage: int = num(0, 0, 3)
    # DeepSpeed ZeRO: keep the optimizer state in CPU memory.
    offload_optimizer: bool = False
    # DeepSpeed ZeRO-3: keep the parameters in CPU memory.
    offload_params: bool = False
    # Across strategies: recompute each transformer block's activations in backward instead of keeping them (less
    # memory, about a third more compute).
    activation_checkpointing: bool = False
    # torch.compile each transformer block (or the whole model: strategy.compile_unit).
    compile: bool = False
    # What strategy.compile compiles: blocks (each on its own, every strategy) or model (one graph across the blocks
    # and the head: strategy=single or ddp). contract/rules/compile_modes.py.
    compile_unit: str = "blocks"
    # CUDA graphs (torch.compile's reduce-overhead mode) over the compiled code: one launch replays a region's
    # kernels. Needs strategy.compile, GPUs and a static step (single or ddp, no document mask); refused elsewhere.
    cuda_graphs: bool = False
    # What gradients travel as when the data-parallel ranks average them: auto | none | bf16 | fp16 | powersgd
    # (contract/rules/grad_compression.py: auto is the compute dtype for bf16/fp16/fp8 runs across nodes, else none;
    # ddp takes all, fsdp/fsdp_grad_op/hsdp bf16 and fp16 as FSDP2's reduce dtype, DeepSpeed none).
    grad_compression: str = "auto"
    # strategy.grad_compression=powersgd: the rank of each gradient matrix's low-rank approximation.
    powersgd_rank: int = num(4, 1)


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
    # Context parallelism: every sequence split over this many ranks, each holding a head and a tail chunk of 2 x cp
    # (causal work even), at its positions in the whole sequence; taken from the data-parallel ranks (data
    # parallelism is world / (tp x pp x cp)), gradients averaged over both. data.seq_len must divide by 2 x cp.
    cp: int = num(1, 1)
    # Expert parallelism (model.moe): a MoE layer's experts split over this many data-parallel ranks (neighbouring
    # ones), tokens sent to their experts' rank and back by all-to-all; each expert is replicated over the
    # data-parallel ranks / ep groups. Must divide the data-parallel size and model.moe.num_experts.
    ep: int = num(1, 1)
    # Fault-tolerant replica groups (torchft, `pip install -e .[ft]`; docs/faults.md): the data-parallel ranks split
    # into this many groups, each its own process group, gradients averaged across groups through torchft's Manager;
    # a group that fails is torn down and restarted alone, and heals from a live group. 1: off.
    replica_groups: int = num(1, 1)
    # host:port of a torchft lighthouse already running; None: the launcher starts one (locally on 127.0.0.1; under
    # SLURM as a job of its own); login: under SLURM, on the login node, kept until the array ends. Its address is
    # in RUN_DIR/lighthouse.json.
    lighthouse: str | None = None
    # The lighthouse's: a group that sends no heartbeat for this long is dropped from the quorum.
    replica_heartbeat_timeout_ms: int = num(5000, 100)
    # The lighthouse's: how long a quorum waits for live groups that have not joined it yet.
    replica_join_timeout_ms: int = num(10000, 100)
    # How long a step waits for a quorum before the group gives up.
    replica_quorum_timeout_s: int = num(60, 1)
    # How long a cross-group all-reduce or a heal may take before the step is discarded; the commit vote waits twice
    # this (a group's ranks reach it up to this far apart: one whose all-reduce failed at once, one that waited).
    replica_timeout_s: int = num(30, 1)
    # A rank of a group that gives no sign of life for this long (frozen: SIGSTOP, a hung host) ends its group, which
    # is started again and heals, so that it does not hold the other groups' quorum (train/replicas/liveness.py).
    replica_peer_timeout_s: int = num(20, 2)


@dataclass
class PrecisionConfig:
    # The precision's name: set by the group option (precision=bf16), never typed.
    name: str = MISSING
    # Dtype of the autocast region; fp32 means no autocast.
    compute_dtype: str = "float32"  # float32 | bfloat16 | float16
    # precision=fp8 (torchao float8 training, contract/rules/float8.py): how casts to float8 are scaled, tensorwise
    # (one scale a tensor; FSDP2 all-gathers the weights in float8) or rowwise (a scale per row: more accurate,
    # communication in bf16).
    float8_recipe: str = "tensorwise"
    # precision=fp8: which of the blocks' linear layers run in float8. auto: torchao's size rule for the recipe leaves
    # those too small to gain in bf16 (contract/rules/float8.py small_layer); all: every one whose dimensions divide
    # by 16 (tests, measurements).
    float8_filter: str = "auto"


@dataclass
class TrainerConfig:
    # How long the run trains: trainer.max_steps, or a budget the launch plan converts to steps (the first step that
    # reaches it) and writes into the ranks' config.yaml as trainer.max_steps, which the schedule, the loop, evaluation
    # jobs and status read (launcher/plan/run_length.py). None of them typed: 100 steps. Not part of the run name: the
    # same command with a larger budget extends the run.
    max_steps: int | None = num(None, 1)
    # Input tokens, global batch x data.seq_len a step (2e12 may be typed; a whole number).
    max_tokens: float | None = num(None, 1)
    # Passes over data.path's samples, or over the mixture source trainer.epochs_of names (0.5: half of one).
    max_epochs: float | None = num(None, 0, lo_open=True)
    # trainer.max_epochs over a mixture: the source whose passes are counted (None: data.path's samples).
    epochs_of: str | None = None
    # Sequences per rank per forward and backward pass.
    micro_batch_size: int = num(8, 1)
    # None: derived from global_batch_size (or 1 when that is unset too).
    grad_accum_steps: int | None = num(None, 1)
    # Sequences per optimizer step across all ranks; None: micro x accumulation x data-parallel size.
    global_batch_size: int | None = num(None, 1)
    # Seeds the model's initialisation, the data order (data.seed's default) and dropout.
    seed: int = num(1234, 0, SEED_MAX)
    # Log the loss and telemetry every this many optimizer steps.
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
    # A progress bar on rank 0's standard error when it is a terminal.
    progress_bar: bool = True
    # Python's garbage collector during training (train/gc_control.py, as torchtitan does): what set-up made is frozen,
    # automatic collection is off and a young-generation collection runs every this many steps, so that no rank stalls
    # at a random step for a full collection. 0: Python's automatic collection.
    gc_every: int = num(50, 0)
    # How the loss is computed (contract/rules/loss_chunks.py). chunked: the logits made by the output layer, their
    # cross-entropy in chunks of rows when the fp32 copy would be large (compiled per chunk with strategy.compile).
    # fused: the output layer's matmul and the cross-entropy together, a chunk of tokens at a time, so that the
    # logits of the whole micro batch never exist (cut-cross-entropy on CUDA where installed and without z-loss,
    # else slurmtrain's torch version); slurmtrain's transformer only, without tensor or pipeline parallelism.
    loss_impl: str = "chunked"
