"""Which path the training loss takes and what it holds: the ranks' choice (train/loss.py, train/model/fused_head.py)
and the memory estimate's and the plan's (launcher/plan/estimate.py, launch_plan.py), one rule for all.

trainer.loss_impl=chunked (the default): the output layer makes the micro batch's logits; their cross-entropy runs
plain below CHUNK_MIN_BYTES of fp32 copy (bit for bit what it always was: small models, every CPU test) and in
chunks of rows above it. The plain loss upcasts the whole logits to fp32 (tokens x vocabulary x 4 bytes: 4.2 GB for
Llama 3's 128k vocabulary at 8,192 tokens), keeps log-softmax's fp32 output for backward and makes an fp32 gradient
of it. The chunked loss upcasts CHUNK_BYTES of rows at a time and writes the gradient of the logits, in the logits'
own dtype, as it goes (Liger's habit), z-loss in the same pass: what stays is the logits and that gradient.

trainer.loss_impl=fused: the output layer's matmul and the cross-entropy together, CHUNK_BYTES of logits at a time,
the gradients of the hidden states and of the output weight made as it goes: neither the bf16 nor the fp32 logits
of the micro batch exist. It needs the output layer whole on the rank (slurmtrain's transformer, no tensor or
pipeline parallelism). Pure arithmetic; no torch.
"""

from __future__ import annotations

from typing import Any

FP32 = 4
# fp32 bytes of logits one chunk upcasts at a time.
CHUNK_BYTES = 256 * 1024**2
# From this size of the fp32 copy on, the loss is chunked.
CHUNK_MIN_BYTES = 1024**3
IMPLS = ("chunked", "fused")


def chunk_rows(tokens: int, vocab: int) -> int | None:
    """Rows (tokens) per chunk of a micro batch of `tokens` rows over `vocab` logits; None: the plain loss."""
    if tokens * vocab * FP32 < CHUNK_MIN_BYTES:
        return None
    return max(1, CHUNK_BYTES // (vocab * FP32))


def fused_rows(vocab: int) -> int:
    """Rows per chunk of the fused loss: always chunked (a small micro batch is one chunk)."""
    return max(1, CHUNK_BYTES // (vocab * FP32))


def impl(cfg: Any) -> str:
    return str(cfg.trainer.get("loss_impl", "chunked"))


def fused_refusal(cfg: Any) -> str | None:
    """Why trainer.loss_impl=fused can't run with this config (one line naming the fix), or None."""
    if impl(cfg) != "fused":
        return None
    fix = "set trainer.loss_impl=chunked"
    m, p = cfg.model, cfg.get("parallel") or {}
    tp, pp = int(p.get("tp", 1)), int(p.get("pp", 1))
    if m.get("_target_") or m.get("config_path"):
        return (f"trainer.loss_impl=fused computes slurmtrain's own transformer's output layer with the loss, and "
                f"model={m.name} is another model: {fix}")
    if tp > 1:
        return (f"trainer.loss_impl=fused needs the output layer whole on each rank, and parallel.tp={tp} splits "
                f"its vocabulary over the tensor-parallel ranks: {fix} (the logits are gathered, then chunked)")
    if pp > 1:
        return f"trainer.loss_impl=fused is not wired into the pipeline's last stage (parallel.pp={pp}): {fix}"
    return None


def path(cfg: Any, tokens: int, vocab: int) -> str:
    """plain | chunked | fused: what a micro batch of `tokens` rows over `vocab` logits runs."""
    if impl(cfg) == "fused":
        return "fused"
    return "plain" if chunk_rows(tokens, vocab) is None else "chunked"


def loss_bytes(tokens: int, vocab: int, compute_bytes: int, kind: str | None = None, d_model: int = 0) -> float:
    """Bytes the loss holds at its peak beside the model's activations. plain: the logits (compute dtype), their
    fp32 copy and its gradient; chunked: the logits, their gradient in the logits' dtype and one chunk's fp32 work;
    fused: the fp32 gradients of the hidden states (tokens x d_model) and of the output weight (vocab x d_model),
    made in forward, and one chunk's logits and fp32 work."""
    kind = kind or ("plain" if chunk_rows(tokens, vocab) is None else "chunked")
    if kind == "plain":
        return float(tokens * vocab * (compute_bytes + 2 * FP32))
    if kind == "fused":
        chunk = min(tokens, fused_rows(vocab)) * vocab
        return float(FP32 * d_model * (tokens + vocab) + chunk * (compute_bytes + 2 * FP32))
    return float(tokens * vocab * 2 * compute_bytes + 2 * CHUNK_BYTES)


def plan_line(tokens: int, vocab: int, cfg: Any = None) -> str:
    """The plan's line on the loss's path (empty for the plain loss of a small micro batch)."""
    copy = f"{tokens * vocab * FP32 / 1024**3:.1f} GB"
    if cfg is not None and impl(cfg) == "fused":
        rows = min(tokens, fused_rows(vocab))
        z = float(cfg.optim.get("z_loss", 0.0) or 0.0)
        library = ("slurmtrain's torch version (cut-cross-entropy has no z-loss)" if z > 0 else
                   "cut-cross-entropy's linear_cross_entropy on CUDA where installed (pip install -e .[cce]), else "
                   "slurmtrain's torch version")
        return (f"loss: fused with the output layer (trainer.loss_impl=fused), {rows} tokens at a time: no logits of "
                f"the micro batch (their fp32 copy would be {copy}); {library}")
    rows_or_none = chunk_rows(tokens, vocab)
    if rows_or_none is None:
        return ""
    compiled = (" (each chunk's arithmetic compiled: strategy.compile)"
                if cfg is not None and cfg.strategy.get("compile") else "")
    return (f"loss: chunked, {rows_or_none} tokens at a time{compiled}, instead of an fp32 copy of the micro batch's "
            f"logits ({copy}); trainer.loss_impl=fused would not make the logits at all")
