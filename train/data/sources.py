"""What a data config reads: one TokenSource, chosen once from data.name (or data._target_)."""

from __future__ import annotations

from typing import Any

from train.data.index import INDEX_VERSION
from train.data.token_source import TokenSource

__all__ = ["TokenSource", "build_source", "data_progress", "token_source"]


def build_source(data_cfg: Any, vocab_size: int, index_version: int = INDEX_VERSION) -> TokenSource:
    """`index_version`: the window order of the checkpoint being resumed (train/data/index.py)."""
    if data_cfg.get("_target_"):
        from train.data.dataset import build_dataset_source

        return build_dataset_source(data_cfg, index_version)
    if data_cfg.name == "synthetic":
        from train.data.synthetic import SyntheticTokens

        return SyntheticTokens(vocab_size, data_cfg.seq_len, data_cfg.seed, data_cfg.signal)
    if data_cfg.name == "tokens":
        return token_source(data_cfg, index_version)
    raise ValueError(f"unknown data source {data_cfg.name!r}")


def token_source(data_cfg: Any, index_version: int = INDEX_VERSION) -> TokenSource:
    """data=tokens: the windows of data.path (a token file, a prepared directory's train split, a glob of files),
    or a mixture of data.sources."""
    from contract.data.spec import token_sources
    from train.data.sft import source_of

    specs = token_sources(data_cfg, on_ranks=True)
    windows = {s.name: source_of(s, int(data_cfg.seq_len), int(data_cfg.seed), bool(data_cfg.shuffle), index_version,
                                 what=f"{s.key}={s.path}") for s in specs}
    if not data_cfg.get("sources"):
        return windows[""]
    from contract.data.mixture import Mixture

    return Mixture(windows, {s.name: s.weight for s in specs})


def data_progress(source: TokenSource, samples: int) -> dict[str, Any]:
    """metrics.jsonl's data fields after `samples` samples: a token file's `epoch`, a mixture's `tokens_by_source`
    and `epoch_by_source` (pure functions of the position); nothing for other sources."""
    progress = getattr(source, "progress", None)
    return progress(samples) if progress is not None else {}
