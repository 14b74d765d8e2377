"""model=hf_causal_lm: read the local Hugging Face config (plain JSON, no transformers on the login node)."""

from __future__ import annotations

import json
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


def apply_hf_config(cfg: DictConfig) -> None:
    """The model's vocabulary comes from its config (synthetic data draws tokens from it), and the sequence
    length must fit its position table."""
    m = cfg.model
    data = read_hf_config(m.config_path)
    with open_dict(cfg):
        m.config_path = str(config_file(m.config_path).resolve())
        if "vocab_size" in data:
            m.vocab_size = int(data["vocab_size"])
    limit = data.get("max_position_embeddings")
    if limit and cfg.data.seq_len > int(limit):
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} exceeds max_position_embeddings={limit} of "
                          f"{m.config_path}: set data.seq_len<={limit}")
