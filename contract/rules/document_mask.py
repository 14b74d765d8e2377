"""data.document_mask: what it needs (checked at launch, one line naming the fix) and the plan's attention line.

The ranks mask attention within the documents a prepared dataset records (contract/data/documents.py), in
slurmtrain's transformer (train/model/document_mask.py): flex attention on GPUs, a dense boolean mask on CPUs.
Every strategy takes it (DDP, FSDP, DeepSpeed, tensor and pipeline parallelism: the document ids go to the model,
and to every pipeline stage, beside the tokens). What can't take it is refused here rather than trained unmasked.
"""

from __future__ import annotations

from typing import Any

from contract.errors import ConfigError, shown

_DROP = "or drop data.document_mask"


def enabled(cfg: Any) -> bool:
    return bool(cfg.data.get("document_mask", False))


def check_document_mask(cfg: Any, on_gpus: bool) -> None:
    """Refuse data.document_mask=true where the documents are unknown or the model can't mask by them."""
    if not enabled(cfg):
        return
    m, d = cfg.model, cfg.data
    if m.get("_target_"):
        what = "a Hugging Face model" if m.get("config_path") else f"model._target_={m._target_}"
        raise ConfigError(f"data.document_mask=true is built into slurmtrain's transformer and model={m.name} is "
                          f"{what}, which would attend across documents: use model=tiny, gpt2_* or llama3_* "
                          f"(model.init_from=... to start from imported weights), {_DROP}")
    if d.get("_target_") or d.name != "tokens":
        what = "data._target_=" + str(d._target_) if d.get("_target_") else f"data={d.name}"
        raise ConfigError(f"data.document_mask=true needs the documents a prepared dataset records and {what} has "
                          f"none: train on data=tokens data.path=DIR (python -m launcher.prepare), {_DROP}")
    from contract.data.spec import token_sources

    for spec in token_sources(d):
        if spec.manifest is None:
            raise ConfigError(_unprepared(spec.key, spec.path))
    _check_eval_sets(cfg)
    if on_gpus and float(m.dropout) > 0:
        raise ConfigError(f"model.dropout={shown(m.dropout)} with data.document_mask=true on GPUs: flex attention has no "
                          "attention dropout; set model.dropout=0")


def _unprepared(key: str, path: str) -> str:
    return (f"data.document_mask=true needs the documents a prepared dataset records and {key}={path} is a token "
            f"file, which records none: prepare the text with `python -m launcher.prepare INPUTS --out DIR "
            f"--tokenizer T` and set {key}=DIR, {_DROP}")


def _check_eval_sets(cfg: Any) -> None:
    """Validation honours the mask too: every set must record its documents."""
    from contract.data.manifest import is_prepared_dir
    from contract.rules.eval_sets import resolved_sets, validates

    if not validates(cfg):
        return
    for name, entry in resolved_sets(cfg).items():
        key = f"eval.sets.{name}"
        if entry["kind"] in ("synthetic", "dataset"):
            raise ConfigError(f"data.document_mask=true masks validation too and {key}.kind={entry['kind']} records "
                              f"no documents: validate on a prepared dataset ({key}.kind=val), {_DROP}")
        if not is_prepared_dir(str(entry["path"])):
            raise ConfigError(_unprepared(f"{key}.path", str(entry["path"])))


def attention_line(cfg: Any, on_gpus: bool) -> str:
    """The plan's line: which attention the ranks run (empty without data.document_mask)."""
    if not enabled(cfg):
        return ""
    path = "flex attention" if on_gpus else f"dense mask on CPU, {_mask_size(cfg)}"
    return f"attention: block-causal by document, positions restart at each document ({path})"


def _mask_size(cfg: Any) -> str:
    """The dense mask's size in words: one byte (a boolean) per query and key of a sample; under context parallelism
    a rank's seq_len / cp queries attend to the group's seq_len keys."""
    seq, cp = int(cfg.data.seq_len), int(cfg.parallel.get("cp", 1)) if cfg.get("parallel") is not None else 1
    size = seq // cp * seq
    shape = f"{seq // cp} x {seq}" if cp > 1 else f"{seq} x {seq}"
    where = " per rank (its seq_len / cp queries, every key)" if cp > 1 else ""
    amount = f"{size / 1024**2:.3g} MB" if size >= 1024**2 else f"{size / 1024:.3g} KB"
    return f"{shape} booleans = {amount} per sample{where}"

