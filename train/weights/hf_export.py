"""A checkpoint's weights as a self-contained Hugging Face directory that has proven itself: config.json,
generation_config.json (the run's end-of-document id as eos_token_id; config.json's bos/eos/pad ids are the
tokenizer's own, or null), safetensors (sharded past max_shard_size
with model.safetensors.index.json, as save_pretrained shards), the run's tokenizer when it has one, in the dtype
asked for. Run by launcher/export.py (--format hf) and at the end of training (checkpoint.export_hf).

slurmtrain's own transformer goes through its family's adapter (train/weights/hf_adapters.py: LlamaForCausalLM or
GPT2LMHeadModel, config from contract/rules/hf_native.py); a model=hf_causal_lm run's weights already carry the
Hugging Face names. Everything is written into a temporary directory beside the destination, loaded back and
compared with slurmtrain's model (train/weights/hf_verify.py), and only then renamed into place: an export that
fails to reproduce the model leaves nothing behind and says by how much it missed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contract.data.run_tokenizer import RunTokenizer, run_tokenizer
from contract.errors import ConfigError
from contract.rules.hf_config import HF_TARGET
from train.weights.export import follow_umask
from train.weights.hf_verify import ExportMismatch, Verified, quiet_transformers, verify

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_SHARD = "50GB"  # save_pretrained's default max_shard_size (transformers 5)


@dataclass
class Exported:
    path: Path
    verified: Verified | None  # None: written with --no-verify
    lines: list[str] = field(default_factory=list)  # what to tell the user, one line each


def hf_form(model_cfg: Any, state: dict[str, torch.Tensor], eos_id: int | None) -> tuple[Any, dict[str, torch.Tensor]]:
    """The Hugging Face config and the state under its names: our transformer's through its family's adapter
    (ConfigError when no class computes it exactly), a Hugging Face model's as it is."""
    from transformers import AutoConfig

    from train.model.hf import load_config

    if model_cfg.get("_target_") == HF_TARGET:
        config = load_config(str(model_cfg.config_path))
        hf_state = state
    elif not model_cfg.get("_target_"):  # slurmtrain's own transformer
        from contract.rules.hf_native import hf_config
        from train.weights.hf_adapters import adapter

        arguments = hf_config(model_cfg)
        config = AutoConfig.for_model(arguments.pop("model_type"), **arguments)
        hf_state = adapter(model_cfg).to_hf(state)
    else:
        raise ConfigError(f"--format hf takes slurmtrain's transformer or model=hf_causal_lm, and this run's model is "
                          f"model._target_={model_cfg._target_}: use --format safetensors")
    if eos_id is not None:
        config.eos_token_id = eos_id
    return config, hf_state


def cast(state: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """The tensors in `dtype`; ConfigError when that turns finite weights into infinities (float16's range)."""
    out = {}
    for name, tensor in state.items():
        converted = tensor.detach().to("cpu", DTYPES[dtype]).contiguous()
        if converted.is_floating_point() and not bool(torch.isfinite(converted).all()) and bool(
                torch.isfinite(tensor).all()):
            raise ConfigError(f"--dtype {dtype} can't hold {name} (|values| up to {float(tensor.abs().max()):.3g}): "
                              "export with --dtype bfloat16 or float32")
        out[name] = converted
    return out


def save_model(config: Any, state: dict[str, torch.Tensor], out: Path, max_shard_size: int | str) -> None:
    """save_pretrained of a model that holds `state` (built on the meta device: no second copy of the weights), a
    tied output layer tied, and a generation config that stops at the config's eos_token_id."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    given = {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")}
    missing, unexpected = model.load_state_dict(given, strict=False, assign=True)
    if tied:
        model.tie_weights()
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"the checkpoint does not match the config: missing {sorted(missing)[:5]}, unexpected "
                         f"{sorted(unexpected)[:5]}")
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, bos_token_id=None)
    model.save_pretrained(str(out), max_shard_size=max_shard_size)  # type: ignore[operator]


def reference_model(model_cfg: Any, state: dict[str, torch.Tensor]) -> nn.Module:
    """slurmtrain's model holding `state` (the weights as written) in float32, eval mode."""
    from train.model.sample import with_weights

    return with_weights(model_cfg, {k: v.float() for k, v in state.items()}, "the checkpoint").float().eval()


def host_memory_available() -> int:
    """Bytes this machine can still give (MemAvailable), or 0 when it does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def verify_memory(state: dict[str, torch.Tensor]) -> int:
    """Bytes verification takes beyond what is held already: two float32 models (slurmtrain's, and the export
    loaded back)."""
    return 2 * 4 * sum(t.numel() for t in {id(t): t for t in state.values()}.values())


def check_verify(state: dict[str, torch.Tensor], verify_it: bool) -> None:
    """--no-verify is for a model whose verification does not fit in host memory; without it, such a model is
    refused before anything is written."""
    need, have = verify_memory(state), host_memory_available()
    fits = have == 0 or need < have * 0.9
    gib = f"about {need / 2**30:.1f} GiB of the {have / 2**30:.1f} GiB available"
    if verify_it and not fits:
        raise ConfigError(f"verifying the export needs {gib}: run it on a machine with more memory, or pass "
                          "--no-verify (the export is then not checked)")
    if not verify_it and fits:
        raise ConfigError(f"--no-verify is for a model whose check does not fit in memory, and this one's takes "
                          f"{gib}: drop --no-verify")


def _temporary_beside(out: Path) -> Path:
    """An empty directory on the destination's filesystem (so the final rename is atomic): in its nearest existing
    parent, named to show what it is if a killed export leaves it."""
    base = out.parent
    while not base.exists():
        base = base.parent
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=base))


def export_hf(cfg: Any, state: dict[str, torch.Tensor], out: Path, dtype: str = "float32",
              max_shard_size: int | str = DEFAULT_SHARD, verify_it: bool = True) -> Exported:
    """Write `state` (the checkpoint's weights under our model's names) as a Hugging Face directory at `out`,
    verified unless `verify_it` is False. ConfigError for what can't be exported; ExportMismatch (nothing left at
    `out`) when the written directory does not reproduce the model."""
    from train.observe import quiet
    from train.weights import hf_tokenizer

    quiet.deepspeed_cpu_notice()
    quiet_transformers()
    tokenizer, why_none = run_tokenizer(cfg.data)
    config, hf_state = hf_form(cfg.model, state, tokenizer.eod_id if tokenizer else None)
    max_len = int(min(cfg.model.max_seq_len, getattr(config, "max_position_embeddings", None) or
                      getattr(config, "n_positions", None) or cfg.model.max_seq_len))
    fast = hf_tokenizer.fast_tokenizer(tokenizer, max_len) if tokenizer is not None else None
    if fast is not None or cfg.model.get("_target_") != HF_TARGET:  # a Hugging Face model's own ids stay
        for key, value in hf_tokenizer.special_ids(fast).items():
            setattr(config, key, value)
    check_verify(state, verify_it)
    written = cast(hf_state, dtype)
    del hf_state
    temporary = _temporary_beside(out)
    try:
        save_model(config, written, temporary, max_shard_size)
        del written
        if fast is not None:
            fast.save_pretrained(str(temporary))
        checked = None
        if verify_it:
            reference = reference_model(cfg.model, cast(state, dtype))
            checked = verify(reference, temporary, int(config.vocab_size), max_len, tokenizer)
            del reference
        follow_umask(temporary)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return Exported(out, checked, describe(config, dtype, out, checked, tokenizer, why_none))


def describe(config: Any, dtype: str, out: Path, checked: Verified | None, tokenizer: RunTokenizer | None,
             why_none: str) -> list[str]:
    shards = len(list(out.glob("*.safetensors")))
    architecture = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    lines = [f"export: {architecture} in {dtype}, {shards} safetensors file{'s' if shards > 1 else ''}; "
             + (f"tokenizer {Path(tokenizer.name).name if tokenizer.path else tokenizer.name}, eos_token_id "
                f"{tokenizer.eod_id}" if tokenizer else f"no tokenizer ({why_none}) and no eos_token_id")]
    lines.append(f"export: {checked.describe()}" if checked else
                 "export: not verified (--no-verify): load it and compare it with the run before relying on it")
    return lines


__all__ = ["DTYPES", "DEFAULT_SHARD", "Exported", "ExportMismatch", "export_hf"]
