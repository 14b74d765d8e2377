"""What the launch plan needs to know of a user's model and data, asked of them (run by launcher/plan/probe.py).

    python -m launcher.worker --probe < {"model": {...}, "data": {...}, "strategy": {...}, "seq_len": N}

Imports the `_target_`s, builds the model on the meta device (no memory, no weights; a model that loads weights in
its constructor on the CPU, within a bound, or counted from its weight files: train/model/probe_build.py), asks the
strategy whether it can train it, and, for a user's dataset, reads its first sample; then prints one JSON object:
{"facts": {...}, "note": "..."} or {"error": "...", "kind": KIND}. Kinds "target", "config" are the user's input
(the launcher refuses with the message); "build" means the model could not be built nor its weights read (the plan
goes on without a memory estimate).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from omegaconf import OmegaConf


def embedding_rows(model: Any) -> int | None:
    """How many token ids the model embeds: its input embedding's rows (Hugging Face's accessor, else the first
    nn.Embedding), or None when it has none."""
    from torch import nn

    get = getattr(model, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        emb = None
    emb = emb or next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return int(emb.num_embeddings) if isinstance(emb, nn.Embedding) else None


def facts(model: Any, model_cfg: Any, seq_len: int, strategy_cfg: Any) -> dict[str, Any]:
    from train.model.blocks import blocks_for
    from train.model.build import count_parameters, flops_per_token

    blocks = blocks_for(model, model_cfg, strategy_cfg)
    in_blocks = {id(p) for _, b in blocks for p in b.parameters()}
    root = {id(p): p for p in model.parameters() if id(p) not in in_blocks}
    unique = {id(p): p for p in model.parameters()}.values()
    sizes = [p.numel() for p in unique]
    fpt, source = flops_per_token(model, model_cfg, seq_len)
    return {
        "n_params": count_parameters(model),
        "block_class": sorted({type(b).__name__ for _, b in blocks}),
        "n_blocks": len(blocks),
        "block_params": sum(p.numel() for p in blocks[0][1].parameters()) if blocks else 0,
        "root": sum(p.numel() for p in root.values()),
        "largest_root": max((p.numel() for p in root.values()), default=0),
        "largest_param": max(sizes, default=0),
        "flops_per_token": fpt,
        "flops_source": source,
        "embedding_rows": embedding_rows(model),
        # What the optimizer state is sized by: each trainable parameter's shape, and whether Muon steps it (a 2-D
        # weight of a block).
        "param_shapes": [[list(p.shape), id(p) in in_blocks and p.dim() == 2] for p in unique if p.requires_grad],
    }


def check_data(data_cfg: Any, vocab_size: int, rows: int | None) -> tuple[Any, int]:
    """A user's dataset: its first sample has the configured length and token ids the model can embed. Returns the
    sample's inputs and the dataset's length (its samples: an epoch, for trainer.max_epochs)."""
    from contract.errors import ConfigError
    from train.data import build_source, split_sample

    try:
        source = build_source(data_cfg, vocab_size)  # checks the first sample's length
        size = len(source.dataset)  # type: ignore[attr-defined]
        if size < 1:
            raise ConfigError(f"data._target_={data_cfg._target_} is empty (len 0): check data.args")
        inputs, _ = split_sample(source.sample(0))
    except ConfigError:
        raise
    except Exception as err:  # the user's dataset failed here: it would fail on the ranks too
        cause = err.__cause__ or err
        message = f"{type(cause).__name__}: {cause}".splitlines()[0]
        raise ConfigError(f"data._target_={data_cfg._target_} could not give its first sample ({message}): fix "
                          "data.args or the dataset (launcher.force=true skips this check, for data only the "
                          "compute nodes can read)") from None
    if rows is not None and not inputs.is_floating_point() and inputs.numel():
        high = int(inputs.max())
        if high >= rows:
            raise ConfigError(f"data._target_={data_cfg._target_} gives token id {high}, but the model embeds only "
                              f"{rows} ids: make the model's vocabulary larger than {high} (model.args), or fix the "
                              "data")
    return inputs, size


def unused_parameters(model: Any, inputs: Any) -> list[str] | None:
    """Trainable parameters that one forward and backward on the meta device leaves without a gradient; None when
    the model can't run there (data-dependent code: the check is skipped)."""
    from train.model.build import logits_of

    try:
        logits_of(model(inputs.to("meta"))).float().sum().backward()
    except Exception:
        return None
    return [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]


def refusal(model: Any, model_cfg: Any, strategy_cfg: Any, inputs: Any, seq_len: int, world_size: int) -> str | None:
    """Why the chosen strategy can't train this model (train/strategies/limits.py), or None."""
    import torch

    from train.model.blocks import blocks_for
    from train.strategies import REGISTRY, strategy_class

    name = strategy_cfg.get("name")
    if name not in REGISTRY:  # auto: the ranks ask once it is chosen
        return None
    cls = strategy_class(name)
    if inputs is None:
        inputs = torch.zeros((1, seq_len), dtype=torch.long)
    unused = unused_parameters(model, inputs.unsqueeze(0) if inputs.dim() == 1 else inputs) if world_size > 1 else None
    return cls.refusal(name, model, blocks_for(model, model_cfg, strategy_cfg), unused)


def probe(request: dict[str, Any]) -> dict[str, Any]:
    from contract.errors import ConfigError
    from train.model.build import TargetError, is_ours, resolve_target
    from train.model.probe_build import build_for_probe
    from train.weights.init_weights import init_from_fit

    model_cfg = OmegaConf.create(request["model"])
    strategy_cfg = OmegaConf.create(request.get("strategy") or {"name": "fsdp"})
    data_cfg = OmegaConf.create(request.get("data") or {})
    try:
        if request.get("data_target"):
            resolve_target("data._target_", request["data_target"])
        if model_cfg.get("_target_"):
            resolve_target("model._target_", model_cfg._target_)
    except TargetError as err:
        return {"error": str(err), "kind": "target"}
    try:
        built = build_for_probe(model_cfg)
        if built.model is None and built.facts is None:
            return {"error": built.error, "kind": "build"}
        model = built.model
        answer = built.facts if model is None else facts(model, model_cfg, int(request["seq_len"]), strategy_cfg)
        assert answer is not None
        rows = answer["embedding_rows"]
        vocab = int(model_cfg.vocab_size)
        inputs, samples = check_data(data_cfg, vocab, rows) if data_cfg.get("_target_") else (None, None)
        if rows is not None and rows < vocab and not data_cfg.get("_target_") and not is_ours(model_cfg):
            raise ConfigError(f"model._target_={model_cfg._target_} embeds {rows} token ids, but the data draws ids "
                              f"below model.vocab_size={vocab}: set model.vocab_size={rows} (or build the model "
                              f"with {vocab})")
        reason = None if model is None else refusal(model, model_cfg, strategy_cfg, inputs, int(request["seq_len"]),
                                                    int(request.get("world_size", 1)))
        if reason:
            raise ConfigError(reason)
        fit = {} if model is None else init_from_fit(model, model_cfg)  # model.init_from's weights, while it is here
    except ConfigError as err:
        return {"error": str(err), "kind": "config"}
    return {"facts": answer, "note": built.note, "data_samples": samples, **fit}


def main() -> int:
    print(json.dumps(probe(json.loads(sys.stdin.read()))))
    return 0
