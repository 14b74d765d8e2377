"""A MoE model's routing telemetry for a log step's metrics row (train/model/moe.py keeps the sums on the device).

    moe_load              {layer: routed tokens per expert} over the log interval, every rank's summed
    moe_load_max_mean     the most loaded expert over the mean, the worst layer's (1.0: perfectly even)
    moe_load_max_mean_by_layer   {layer: that ratio}
    moe_dropped           the fraction of routed assignments dropped by model.moe.capacity_factor (0 when dropless)
    moe_aux_loss, moe_z_loss     the load-balancing and router z-losses (before their coefficients), mean over
                                 the MoE layers, micro batches and ranks

One all-reduce at a log step, on every rank (the loop calls it where it logs); nothing between log steps.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from train.model.moe import is_moe_layer, moe_config, moe_layers


def moe_fields(model: torch.nn.Module, model_cfg: Any, device: torch.device) -> dict[str, Any]:
    moe = moe_config(model_cfg)
    if moe is None:
        return {}
    experts = int(moe.num_experts)
    layers = [i for i in range(int(model_cfg.n_layers)) if is_moe_layer(moe, i)]
    # Per MoE layer: tokens per expert, dropped, balance loss, z-loss, micro batches; zeros for a layer this rank
    # lacks (a pipeline stage holds some layers only).
    table = torch.zeros(len(layers), experts + 4, device=device)
    for name, layer in moe_layers(model):
        stats = layer.stats
        if stats is None:
            continue
        row = layers.index(_layer_number(name))
        table[row] = torch.cat([stats.load, stats.dropped.reshape(1), stats.losses, stats.calls.reshape(1)])
        stats.reset()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(table)
    rows = table.cpu().tolist()
    load = {str(layer): row[:experts] for layer, row in zip(layers, rows, strict=True)}
    ratio = {k: (max(v) / (sum(v) / experts) if sum(v) else 1.0) for k, v in load.items()}
    routed = sum(sum(v) for v in load.values())
    calls = sum(row[experts + 3] for row in rows) or 1.0
    return {
        "moe_aux_loss": sum(row[experts + 1] for row in rows) / calls,
        "moe_z_loss": sum(row[experts + 2] for row in rows) / calls,
        "moe_load_max_mean": max(ratio.values()),
        "moe_load_max_mean_by_layer": ratio,
        "moe_dropped": sum(row[experts] for row in rows) / routed if routed else 0.0,
        "moe_load": load,
    }


def _layer_number(module_name: str) -> int:
    """'blocks.3.mlp' (or a wrapper's 'module.blocks.3.mlp', '_orig_mod.' inside) -> 3."""
    parts = module_name.split(".")
    return int(parts[parts.index("blocks") + 1])
