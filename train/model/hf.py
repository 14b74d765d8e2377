"""model=hf_causal_lm: a Hugging Face `transformers` causal LM built from a local config (nothing downloaded).

`transformers` is an optional extra: pip install -e '.[hf]'.
"""

from __future__ import annotations

import json
from typing import Any

from torch import nn

from contract.rules.hf_config import config_file


def load_config(config_path: str) -> Any:
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ImportError("model=hf_causal_lm needs transformers: run `pip install -e .[hf]`") from None
    data = json.loads(config_file(config_path).read_text())
    return AutoConfig.for_model(data.pop("model_type"), **data)


def causal_lm(config_path: str) -> nn.Module:
    """A freshly initialised causal LM of this config (the seed makes it the same on every rank)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(load_config(config_path))  # type: ignore[no-any-return]
