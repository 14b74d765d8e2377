"""What the launch plan needs to know of a user's model, asked of the model itself (run by launcher/probe.py).

    python -m launcher.worker --probe < {"model": {...}, "data": {...}, "seq_len": N}

Imports the `_target_`s and builds the model on the meta device (no memory, no weights), then prints one JSON
object: {"facts": {...}} or {"error": "...", "kind": "target" | "block" | "build"}.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from omegaconf import OmegaConf


def facts(model: Any, model_cfg: Any, seq_len: int) -> dict[str, Any]:
    from train.blocks import find_blocks
    from train.build import count_parameters, flops_per_token

    blocks = find_blocks(model, model_cfg.get("block"))
    in_blocks = {id(p) for _, b in blocks for p in b.parameters()}
    root = {id(p): p for p in model.parameters() if id(p) not in in_blocks}
    sizes = [p.numel() for p in {id(p): p for p in model.parameters()}.values()]
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
    }


def probe(request: dict[str, Any]) -> dict[str, Any]:
    import torch

    from train.blocks import BlockError
    from train.build import TargetError, build_model, resolve_target

    model_cfg = OmegaConf.create(request["model"])
    data_cfg = OmegaConf.create(request.get("data") or {})
    try:
        if data_cfg.get("_target_"):
            resolve_target("data._target_", data_cfg._target_)
        if model_cfg.get("_target_"):
            resolve_target("model._target_", model_cfg._target_)
    except TargetError as err:
        return {"error": str(err), "kind": "target"}
    try:
        with torch.device("meta"):
            model = build_model(model_cfg)
    except Exception as err:  # the user's code: reported; only a call that does not match the arguments is fatal
        cause = err.__cause__ or err  # Hydra wraps the target's own exception
        message = f"{type(cause).__name__}: {cause}".splitlines()[0]
        if isinstance(cause, TypeError) and "argument" in str(cause):
            return {"error": f"model._target_={model_cfg._target_} does not take these arguments ({message}): "
                             "fix model.args", "kind": "args"}
        return {"error": message, "kind": "build"}
    try:
        return {"facts": facts(model, model_cfg, int(request["seq_len"]))}
    except BlockError as err:
        return {"error": str(err), "kind": "block"}


def main() -> int:
    print(json.dumps(probe(json.loads(sys.stdin.read()))))
    return 0
