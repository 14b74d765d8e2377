"""Reading a prepared dataset's splits (python -m launcher.prepare; the format is contract/data/manifest.py).

The train split is what data.path (or a mixture's source) trains on: contract/data/spec.py resolves it into one
stream of its shards. The validation split is read here, for validation loss: every window once, in order.
"""

from __future__ import annotations

from typing import Any

from contract.data.spec import token_sources
from train.data.sft import source_of


def validation_sources(data_cfg: Any) -> dict[str, Any]:
    """The validation split of each prepared source of a data=tokens config, by source name ("" for data.path),
    as windows of data.seq_len + 1 tokens (or, for supervised fine-tuning data, its samples: train/data/sft.py) in order (sample i is window i; past the end it wraps). Sources that are
    not prepared directories, or whose validation split is shorter than one sample, are left out."""
    if data_cfg.get("_target_") or data_cfg.name != "tokens":
        return {}
    seq_len = int(data_cfg.seq_len)
    out = {}
    for spec in token_sources(data_cfg, split="val", on_ranks=True):
        if spec.manifest is not None and spec.windows(seq_len) >= 1:
            out[spec.name] = source_of(spec, seq_len, int(data_cfg.seed), shuffle=False,
                                       what=f"{spec.key}={spec.path} (validation split)")
    return out
