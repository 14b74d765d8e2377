"""Document masking (data.document_mask): each token attends only to the earlier tokens of its own document
(block-causal), and positions restart at each document, as if every document of a packed sample ran alone.

The documents come with the batch (train/data/batches.py: a prepared dataset's own record of them), as one
id per token; the model computes from them, once per forward, the positions and the attention mask its layers
share. Two paths give the same attention: flex attention (torch.nn.attention.flex_attention) with a block mask,
which skips the blocks that cross documents, on GPUs; a dense boolean mask through scaled_dot_product_attention,
which runs everywhere, on CPUs (it costs seq_len^2 booleans per sample). torchtitan's block_causal flex attention
and Megatron's reset attention mask and position ids do the same.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# Compiled once per process, at the first flex forward (torchtitan compiles it the same way): eager flex attention
# materialises the scores and is only for checking.
_compiled: dict[str, Any] = {}


def positions_in_documents(document_ids: torch.Tensor) -> torch.Tensor:
    """[b, t] document ids -> [b, t] positions counted from each document's first token."""
    t = document_ids.shape[1]
    index = torch.arange(t, device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values
    return index - first


def dense_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """[b, 1, t, t] booleans, True where query token i may attend to key token j: j <= i, same document."""
    t = document_ids.shape[1]
    same = document_ids[:, :, None] == document_ids[:, None, :]
    causal = torch.ones(t, t, dtype=torch.bool, device=document_ids.device).tril()
    return (same & causal).unsqueeze(1)


def flex_mask(document_ids: torch.Tensor, compiled: bool = True) -> Any:
    """The same rule as a flex attention BlockMask (heads broadcast)."""
    docs = document_ids

    def block_causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    return block_mask(block_causal, docs.shape[0], docs.shape[1], docs.shape[1], docs.device, compiled)


def block_mask(rule: Any, batch: int | None, q_len: int, kv_len: int, device: torch.device,
               compiled: bool = True) -> Any:
    """A flex attention BlockMask of `rule(b, h, q, kv)` (heads broadcast; batch None: broadcast too)."""
    from torch.nn.attention.flex_attention import create_block_mask

    make = _compiled.setdefault("create_block_mask", torch.compile(create_block_mask)) if compiled else \
        create_block_mask
    return make(rule, batch, None, q_len, kv_len, device=device)


def uses_flex(device: torch.device) -> bool:
    """Which path a device runs: flex attention on CUDA, the dense mask elsewhere (the launch plan says the same,
    contract/rules/document_mask.py)."""
    return device.type == "cuda"


def attention_mask(document_ids: torch.Tensor) -> Any:
    """The mask every layer of this forward uses: a BlockMask on CUDA, dense booleans elsewhere."""
    return flex_mask(document_ids) if uses_flex(document_ids.device) else dense_mask(document_ids)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout: float,
                     compiled: bool = True) -> torch.Tensor:
    """Attention of [b, heads, t, head_dim] queries, keys and values (keys and values already repeated to the
    query heads) under `mask`: a dense boolean one, or a flex BlockMask."""
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    if dropout:
        raise ValueError("flex attention has no attention dropout: set model.dropout=0 with data.document_mask=true")
    from torch.nn.attention.flex_attention import flex_attention

    flex = _compiled.setdefault("flex_attention", torch.compile(flex_attention)) if compiled else flex_attention
    return flex(q, k, v, block_mask=mask)  # type: ignore[no-any-return]
