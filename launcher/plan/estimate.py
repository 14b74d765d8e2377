"""What a config costs, before it runs: FLOPs, memory per GPU, step time. Pure arithmetic on the config; no torch.

FLOPs per token come from the contract (contract/rules/flops.py), which the training side's telemetry counts
with too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contract.rules import float8
from contract.rules.flops import flops_per_token
from contract.rules.loss_chunks import loss_bytes
from contract.rules.loss_chunks import path as loss_path
from contract.rules.moe_shape import (
    dense_mlp_params,
    expert_params,
    largest_mlp_params,
    moe_layer_numbers,
    moe_of,
)
from contract.rules.optimizers import count_shapes, state_bytes

GB = 1024**3
FP32 = 4


def dtype_bytes(precision_name: str) -> int:
    """Bytes of the compute dtype: fp8's is bf16 (autocast), float8 only inside its linear layers."""
    return 2 if precision_name in ("bf16", "fp16", "fp8") else 4


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU (per rank), by what holds them; `host` is what offloading keeps in CPU memory instead."""

    params: float
    grads: float
    optimizer: float
    activations: float
    temporary: float
    margin: float
    host: float = 0.0
    # False for a user's model: activations are not counted, so the total is a lower bound.
    activations_known: bool = True

    @property
    def states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations + self.temporary + self.margin

    def as_gb(self) -> dict[str, float]:
        names = ("params", "grads", "optimizer", "activations", "temporary", "margin", "total", "host")
        return {name: round(getattr(self, name) / GB, 3) for name in names}

    def breakdown(self) -> str:
        g = self.as_gb()
        activations = (f"activations {g['activations']:.2f}" if self.activations_known
                       else "activations not estimated (a model from model._target_)")
        text = (f"params {g['params']:.2f} + grads {g['grads']:.2f} + optimizer {g['optimizer']:.2f} + {activations}"
                f" + temporary {g['temporary']:.2f} + margin {g['margin']:.2f} = "
                f"{'at least ' if not self.activations_known else ''}{g['total']:.2f} GB")
        return text + (f" (+ {g['host']:.2f} GB in host memory)" if self.host else "")


def block_params(m: Any) -> int:
    d = m.d_model
    head_dim = d // m.n_heads
    kv = (m.n_kv_heads or m.n_heads) * head_dim
    norm = d if m.norm == "rmsnorm" else 2 * d
    # The largest block's: a MoE layer's every expert (contract/rules/moe_shape.py).
    return 2 * d * d + 2 * kv * d + largest_mlp_params(m) + 2 * norm


def param_shapes(m: Any) -> tuple[tuple[tuple[int, ...], bool, int], ...]:
    """Our transformer's parameter shapes: each distinct shape, whether it is a 2-D weight of a block (what Muon
    steps), and how many parameters have it. A block's shapes are counted once and multiplied by the layer count,
    so a typo such as model.n_layers=1000000 is refused at once rather than walked parameter by parameter."""
    d, f, heads, n_layers = m.d_model, m.ffn_hidden, m.n_heads, m.n_layers
    q, kv = d // heads * heads, (m.n_kv_heads or heads) * (d // heads)
    norm = ((d,),) if m.norm == "rmsnorm" else ((d,), (d,))
    matrices = [(q, d), (kv, d), (kv, d), (d, q), *([(f, d)] if m.mlp == "swiglu" else []), (f, d), (d, f)]
    block = [(shape, True) for shape in matrices] + [(shape, False) for shape in 2 * norm]
    moe = moe_of(m)
    if moe is not None:  # every MoE layer: its experts' stacked weights and its router in place of the MLP
        experts, mlp = int(moe.num_experts), len(matrices) - 4
        stacked = [((experts, *shape), False) for shape in matrices[4:]]
        shared = [((shape[0] * int(moe.shared_experts), shape[1]) if i < mlp - 1 else
                   (shape[0], shape[1] * int(moe.shared_experts)), True)
                  for i, shape in enumerate(matrices[4:])] if int(moe.shared_experts) else []
        moe_block = [(shape, True) for shape in matrices[:4]] + [((experts, d), False)] + stacked + shared + [
            (shape, False) for shape in 2 * norm]
        moe_layers = len(moe_layer_numbers(m))
    else:
        moe_block, moe_layers = [], 0
    root = [((m.vocab_size, d), False), *[(shape, False) for shape in norm]]
    if m.position == "learned":
        root.append(((m.max_seq_len, d), False))
    if not m.tie_embeddings:
        root.append(((m.vocab_size, d), False))
    # A block's shapes counted once and multiplied by its layers: a typo such as model.n_layers=1000000 is refused
    # at once rather than walked parameter by parameter.
    return (tuple((shape, hidden, count * (n_layers - moe_layers)) for shape, hidden, count in count_shapes(block))
            + tuple((shape, hidden, count * moe_layers) for shape, hidden, count in count_shapes(moe_block))
            + count_shapes(root))


def root_params(m: Any, n_params: int) -> int:
    """Parameters outside the transformer blocks: embeddings, final norm, output layer."""
    moe_layers = len(moe_layer_numbers(m))
    dense_blocks = (m.n_layers - moe_layers) * (block_params(m) - largest_mlp_params(m) + dense_mlp_params(m))
    return n_params - dense_blocks - moe_layers * block_params(m)


def block_activation_bytes(m: Any, compute_bytes: int) -> float:
    """Bytes one block saves for backward, per token: the tensors autograd keeps (counted op by op for our model).
    The residual stream and the norms' statistics stay fp32; projections, attention and the MLP run in the
    compute dtype."""
    d, f, heads = m.d_model, m.ffn_hidden, m.n_heads
    kv = (m.n_kv_heads or m.n_heads) * (d // heads)
    stats = 1 if m.norm == "rmsnorm" else 2
    fp32 = 2 * (d + stats)  # each norm's input (the residual stream) and its statistics
    compute = 2 * d  # each norm's output, the input of the projections that follow
    compute += d + 2 * kv  # q and kv projections
    if m.position == "rope":
        compute += d + kv  # rotated q and k
    if kv != d:
        compute += 2 * d  # k and v repeated to every query head
    compute += d + d  # attention output and its re-laid-out copy (the input of the output projection)
    fp32 += heads  # attention's log-sum-exp
    compute += 4 * f if m.mlp == "swiglu" else 2 * f  # up projection, then silu and product (or gelu)
    if compute_bytes != FP32:
        compute += 2 * d  # autocast's copies of the norms' outputs for the projections
    return FP32 * fp32 + compute_bytes * compute


def head_activation_bytes(m: Any, chunked: bool = False) -> float:
    """Per token outside the blocks: the final norm and, for the plain loss, the fp32 log-softmax over the
    vocabulary. The chunked loss (contract/rules/loss_chunks.py) saves no log-softmax: what it keeps for backward,
    the logits' gradient, is loss_bytes' (counting it here too over-stated gpt2_124m at micro batch 8 x 1024 by
    1.65 GB against an H200's allocator)."""
    stats = 1 if m.norm == "rmsnorm" else 2
    return FP32 * (2 * m.d_model + stats + (0 if chunked else m.vocab_size))


@dataclass(frozen=True)
class Layout:
    """How the states are spread: bytes per parameter held on each rank, and what is gathered on the fly."""

    weight_bytes: int
    grad_bytes: int
    master_bytes: int
    shard: int
    kind: str  # replicated | zero1 | zero2 | zero3 | fsdp | fsdp_grad_op


def layout(cfg: Any, world: int, nodes: int) -> Layout:
    s, precision = cfg.strategy, cfg.precision.name
    if s.backend == "deepspeed":
        w = dtype_bytes(precision)
        # ZeRO keeps an fp32 copy of its partition of the weights beside the optimizer state.
        return Layout(w, w, FP32, world, f"zero{s.zero_stage}")
    if s.name in ("fsdp", "fsdp_grad_op", "hsdp"):
        shard = world
        if s.name == "hsdp":
            shard = world // (s.replicate_degree or max(1, nodes))
        kind = "fsdp" if s.reshard_after_forward else "fsdp_grad_op"
        return Layout(FP32, FP32, 0, max(1, shard), kind)
    # single, ddp: fp32 weights (autocast casts on the fly) and fp32 gradients on every rank.
    return Layout(FP32, FP32, 0, 1, "replicated")


@dataclass(frozen=True)
class ModelShape:
    """What the estimate knows of a model: ours from its config (`config` set, activations counted op by op), a
    user's `model._target_` from the probe (launcher/plan/probe.py: parameters and blocks, no activations)."""

    n_params: int
    block_params: int
    n_blocks: int
    # Outside the blocks: the largest module ZeRO-3 gathers whole (the embedding) and all of it together.
    largest_root: int
    root: int
    # Parameters per gradient-reduce bucket (DeepSpeed's).
    bucket: int
    vocab_size: int | None
    config: Any = None
    # Training FLOPs per token when the model says (a user's model: model.flops_per_token); else computed.
    model_flops_per_token: float | None = None
    # The share of the activations one rank keeps: 1 / tensor-parallel degree (sequence parallel splits the rest;
    # a 1F1B pipeline stage keeps pp micro batches of 1 / pp of the layers, which is the whole model's once).
    activation_share: float = 1.0
    # Each distinct parameter shape, whether it is a 2-D weight of a block, and how many parameters have it: what
    # the optimizer state is sized by (contract/rules/optimizers.py). None: unknown (then every parameter counts as
    # a block's matrix).
    param_shapes: tuple[tuple[tuple[int, ...], bool, int], ...] | None = None

    @classmethod
    def ours(cls, m: Any, n_params: int) -> ModelShape:
        block = block_params(m)
        return cls(n_params, block, m.n_layers, m.vocab_size * m.d_model, root_params(m, n_params), m.d_model**2,
                   m.vocab_size, m, param_shapes=param_shapes(m))

    def optimizer_bytes_per_param(self, optim: Any) -> float:
        """The optimizer's state per parameter, averaged over the model (Adafactor's factors and Muon's split between
        its matrices and AdamW's share make it depend on the shapes)."""
        shapes = self.param_shapes if self.param_shapes is not None else (((1,), True, 1),)
        return state_bytes(optim, shapes) / max(1, sum(count * math.prod(shape) for shape, _, count in shapes))

    @property
    def activations_known(self) -> bool:
        return self.config is not None

    def flops_per_token(self, seq_len: int) -> float:
        if self.config is not None:
            return flops_per_token(self.config, seq_len)
        return self.model_flops_per_token or 6.0 * self.n_params


def _ep(cfg: Any) -> int:
    return int(cfg.parallel.get("ep", 1)) if cfg.get("parallel") is not None else 1


def estimate_memory(cfg: Any, world: int, nodes: int, shape: ModelShape, margin_bytes: float,
                    fragmentation: float) -> MemoryEstimate:
    s = cfg.strategy
    lay = layout(cfg, world, nodes)
    # parallel.ep: a rank holds num_experts / ep of each MoE layer's experts, whole, outside the strategy's sharding
    # (train/strategies/expert_parallel.py); the rest of the parameters follow the strategy's layout.
    experts = expert_params(shape.config) if shape.config is not None and _ep(cfg) > 1 else 0
    own_experts = experts / _ep(cfg) if experts else 0.0
    p, n = float(shape.n_params - experts), lay.shard
    # FSDP gathers a block without its experts under ep (they are not its to shard).
    block_experts = experts // max(1, len(moe_layer_numbers(shape.config))) if experts else 0
    block, root = shape.block_params - block_experts, shape.root
    compute_bytes = dtype_bytes(cfg.precision.name)
    optim = (shape.optimizer_bytes_per_param(cfg.optim) + lay.master_bytes) * p
    host = 0.0
    if lay.kind == "replicated":
        params, grads, optimizer = lay.weight_bytes * p, lay.grad_bytes * p, optim
        temporary = 0.0 if s.gradient_as_bucket_view else lay.grad_bytes * p  # DDP's buckets beside the grads
    elif lay.kind == "zero1":
        params, grads, optimizer = lay.weight_bytes * p, lay.grad_bytes * p, optim / n
        temporary = 2 * lay.grad_bytes * shape.bucket  # reduce buckets
    elif lay.kind == "zero2":
        params, grads, optimizer = lay.weight_bytes * p, lay.grad_bytes * p / n, optim / n
        temporary = 2 * lay.grad_bytes * shape.bucket
    elif lay.kind == "zero3":
        params, grads, optimizer = lay.weight_bytes * p / n, lay.grad_bytes * p / n, optim / n
        # The module being computed (a block, or the embedding / output layer) gathered whole, and the next one
        # prefetched; one block's full gradients before they are reduce-scattered.
        largest = max(block, shape.largest_root)
        temporary = lay.weight_bytes * (largest + block) + lay.grad_bytes * block
        if s.offload_optimizer or s.offload_params:
            host = optimizer + (grads if s.offload_optimizer else 0) + (params if s.offload_params else 0)
            optimizer = 0.0
            grads = 0.0 if s.offload_optimizer else grads
            params = 0.0 if s.offload_params else params
    else:  # fsdp / fsdp_grad_op / hsdp: every state sharded; the root module stays gathered through the step
        params, grads, optimizer = lay.weight_bytes * p / n, lay.grad_bytes * p / n, optim / n
        gathered = (2 * block if lay.kind == "fsdp" else shape.n_blocks * block) + root
        temporary = lay.weight_bytes * gathered * (1 - 1 / n) + lay.grad_bytes * block
    if own_experts:
        params += FP32 * own_experts
        grads += FP32 * own_experts
        optimizer += shape.optimizer_bytes_per_param(cfg.optim) * own_experts
    # parallel.cp: a rank holds seq_len / cp tokens of every sequence (activations and logits divide by cp), and
    # each layer keeps the group's other keys and values, gathered for attention, for its backward.
    cp = int(cfg.parallel.get("cp", 1))
    tokens = cfg.trainer.micro_batch_size * cfg.data.seq_len // cp
    activations = 0.0
    m = shape.config
    if m is not None:
        per_block = block_activation_bytes(m, compute_bytes)
        # The chunked and the fused loss keep no log-softmax (contract/rules/loss_chunks.py).
        chunked = shape.vocab_size is not None and loss_path(cfg, tokens, shape.vocab_size) != "plain"
        if cp > 1:
            kv_width = (m.n_kv_heads or m.n_heads) * (m.d_model // m.n_heads)
            per_block += 2 * (cp - 1) * kv_width * compute_bytes
        if s.activation_checkpointing:
            # Each block keeps only its input; backward recomputes one block at a time.
            activations = tokens * (m.n_layers * FP32 * m.d_model + head_activation_bytes(m, chunked))
            temporary += tokens * per_block * shape.activation_share
        else:
            activations = tokens * (m.n_layers * per_block + head_activation_bytes(m, chunked))
        activations *= shape.activation_share
    if shape.vocab_size:
        # The logits (compute dtype), and their fp32 copy for the loss and its gradient, or chunked for a large
        # vocabulary, or no logits at all with the fused loss (contract/rules/loss_chunks.py).
        temporary += loss_bytes(tokens, shape.vocab_size, compute_bytes, loss_path(cfg, tokens, shape.vocab_size),
                                int(m.d_model) if m is not None else 0)
    if m is not None and m.get("position", "rope") == "rope":
        # RoPE's cos and sin tables, fp32, (max_seq_len, head_dim / 2) each: buffers every rank holds whole, sized
        # by model.max_seq_len, not by the parameters (a typed max_seq_len of 1e8 makes them gigabytes). Counted
        # beside the states, which stay the parameters' own (the ZeRO paper's bytes per parameter).
        temporary += FP32 * m.max_seq_len * (m.d_model // m.n_heads)
    if compute_bytes != FP32 and s.backend != "deepspeed":
        copies = compute_bytes * p
        if m is not None and float8.enabled(cfg.precision):  # the converted weights are cast to float8 instead
            copies -= (compute_bytes - 1) * m.n_layers * float8.float8_params_per_block(m, cfg.precision)
        temporary += copies / n if lay.kind != "replicated" else copies  # autocast's (and float8's) weight copies
        temporary += compute_bytes * own_experts
        if m is not None and lay.kind in ("fsdp", "fsdp_grad_op") and float8.fp8_all_gather(cfg):
            # FSDP2 all-gathers the converted weights in float8 (1 byte) instead of fp32 (4)
            blocks_gathered = 2 if lay.kind == "fsdp" else shape.n_blocks
            temporary -= (lay.weight_bytes - 1) * blocks_gathered * float8.float8_params_per_block(m, cfg.precision) * (1 - 1 / n)
    subtotal = params + grads + optimizer + activations + temporary
    return MemoryEstimate(params, grads, optimizer, activations, temporary,
                          margin_bytes + fragmentation * subtotal, host, shape.activations_known)
