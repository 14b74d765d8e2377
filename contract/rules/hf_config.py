"""model=hf_causal_lm: read the local Hugging Face config (plain JSON, no transformers on the login node)."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from contract.errors import ConfigError

# conf/model/hf_causal_lm.yaml's builder.
HF_TARGET = "train.model.hf.causal_lm"


def config_file(path: str) -> Path:
    p = Path(path).expanduser()
    return p / "config.json" if p.is_dir() else p


def read_hf_config(path: str) -> dict[str, Any]:
    file = config_file(path)
    if not file.is_file():
        raise ConfigError(f"model.config_path={path}: no such config file: point it at a Hugging Face config.json "
                          "(or the directory holding it)")
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"model.config_path={path} is not a readable JSON config ({err}): fix the file") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"model.config_path={path} has no model_type: it must be a Hugging Face config.json")
    return data


def position_limit(data: dict[str, Any]) -> tuple[str, int] | None:
    """(field, value) of the longest sequence a config's position table takes: max_position_embeddings, or GPT-2's
    n_positions (n_ctx in early files); None for a model without one."""
    for field in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(data.get(field), int) and data[field] > 0:
            return field, int(data[field])
    return None


def apply_hf_config(cfg: DictConfig, typed: Collection[str] = ()) -> None:
    """The model's vocabulary comes from its config (synthetic data draws tokens from it), and its context length
    (model.max_seq_len, so data.seq_len) defaults to the config's position limit. `typed`: the model keys typed on
    the command line; a typed vocabulary other than the config's is refused, a typed context kept within the limit."""
    m = cfg.model
    data = read_hf_config(m.config_path)
    path = str(config_file(m.config_path).resolve())
    limit = position_limit(data)
    if "vocab_size" in data and "vocab_size" in typed and m.vocab_size != int(data["vocab_size"]):
        raise ConfigError(f"model.vocab_size={m.vocab_size} disagrees with vocab_size={data['vocab_size']} of {path}: "
                          "drop model.vocab_size (model=hf_causal_lm takes its config's)")
    if limit and "max_seq_len" in typed and m.max_seq_len > limit[1]:
        raise ConfigError(f"model.max_seq_len={m.max_seq_len} exceeds {limit[0]}={limit[1]} of {path}: set "
                          f"model.max_seq_len<={limit[1]}, or drop it (it defaults to {limit[1]})")
    with open_dict(cfg):
        m.config_path = path
        if "vocab_size" in data:
            m.vocab_size = int(data["vocab_size"])
        if limit and "max_seq_len" not in typed:
            m.max_seq_len = limit[1]
    if limit and cfg.data.seq_len > limit[1]:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} exceeds {limit[0]}={limit[1]} of {m.config_path}: set "
                          f"data.seq_len<={limit[1]}")
