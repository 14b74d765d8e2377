"""When the training loss runs in chunks of rows: the ranks' choice (train/loss.py) and the memory estimate's
(launcher/plan/estimate.py), one rule for both.

The plain loss upcasts the whole micro batch's logits to fp32 (tokens x vocabulary x 4 bytes: 4.2 GB for Llama 3's
128k vocabulary at 8,192 tokens), keeps log-softmax's fp32 output for backward and makes an fp32 gradient of it.
The chunked loss upcasts CHUNK_BYTES of rows at a time and writes the gradient of the logits, in the logits'
own dtype, as it goes (Liger's habit): what stays is the logits and that gradient. Below CHUNK_MIN_BYTES it is not
worth a launch per chunk and the plain loss runs (bit for bit what it always was: small models, every CPU test).
Pure arithmetic; no torch.
"""

from __future__ import annotations

FP32 = 4
# fp32 bytes of logits one chunk upcasts at a time.
CHUNK_BYTES = 256 * 1024**2
# From this size of the fp32 copy on, the loss is chunked.
CHUNK_MIN_BYTES = 1024**3


def chunk_rows(tokens: int, vocab: int) -> int | None:
    """Rows (tokens) per chunk of a micro batch of `tokens` rows over `vocab` logits; None: the plain loss."""
    if tokens * vocab * FP32 < CHUNK_MIN_BYTES:
        return None
    return max(1, CHUNK_BYTES // (vocab * FP32))


def loss_bytes(tokens: int, vocab: int, compute_bytes: int) -> float:
    """Bytes the loss holds at its peak beside the model's activations: the logits (compute dtype) and, plain, their
    fp32 copy and its gradient; chunked, the gradient in the logits' dtype and one chunk's fp32 work."""
    if chunk_rows(tokens, vocab) is None:
        return float(tokens * vocab * (compute_bytes + 2 * FP32))
    return float(tokens * vocab * 2 * compute_bytes + 2 * CHUNK_BYTES)


def plan_line(tokens: int, vocab: int) -> str:
    """The plan's line when the loss runs chunked (empty otherwise)."""
    rows = chunk_rows(tokens, vocab)
    if rows is None:
        return ""
    return (f"loss: chunked, {rows} tokens at a time, instead of an fp32 copy of the micro batch's logits "
            f"({tokens * vocab * FP32 / 1024**3:.1f} GB)")
