"""Expert parallelism inside pipeline stages (parallel.ep with parallel.pp): the ep and edp groups of
train/strategies/expert_parallel.py drawn from the data-parallel (x cp) ranks of one stage, not the whole world.

A rank's data-parallel index within its stage is dp x cp + c (the layout of train/strategies/mesh.py); ep takes N
consecutive ones, as without a pipeline, and the ranks of another stage (which hold other layers) take theirs
alike. The experts' gradients are averaged over the stage's data-parallel x cp ranks, their checkpoint tensors live
on the stage's (edp, ep) mesh, and the global gradient norm sums every stage's squares, experts included.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from train.strategies.expert_parallel import ExpertParallel


class StageExpertParallel(ExpertParallel):
    def __init__(self, ep: int, device_type: str, layout: Any) -> None:  # not ExpertParallel.__init__: another mesh
        ranks = layout.mesh.mesh.reshape(-1, layout.cp, layout.pp, layout.tp)  # (dp, cp, pp, tp), HSDP's dp joined
        data = ranks.permute(2, 3, 0, 1).reshape(layout.pp * layout.tp, -1, ep)  # per (stage, tp): (edp, ep)
        full = DeviceMesh(device_type, data, mesh_dim_names=("stage", "edp", "ep"))
        self.ep, self.edp = ep, data.shape[1]
        self.mesh = full["edp", "ep"]
        self.ep_group = self.mesh.get_group("ep")
        self.edp_group = self.mesh.get_group("edp")
        self.ep_rank = self.mesh.get_local_rank("ep")
        self.dp_size = layout.dp * layout.cp  # the ranks whose gradients are averaged
        self.pp_group = layout.pp_group
        self.names: list[str] = []
        self.params: list[nn.Parameter] = []

    def _total_norm(self, dense_norm: torch.Tensor, expert_sq: torch.Tensor) -> torch.Tensor:
        """ExpertParallel's, with the squares of every stage summed (the pipeline's global norm), in float64."""
        squared = (dense_norm.double().pow(2) + expert_sq.double())
        dist.all_reduce(squared, group=self.pp_group)
        return squared.sqrt().to(dense_norm.dtype)


def apply_stage_expert_parallel(model: nn.Module, cfg: Any, device_type: str, layout: Any) -> ExpertParallel | None:
    """parallel.ep > 1 under parallel.pp: shard this stage's experts over its data-parallel ranks."""
    ep = int(cfg.parallel.get("ep", 1))
    if ep == 1:
        return None
    expert_parallel = StageExpertParallel(ep, device_type, layout)
    expert_parallel.shard(model)
    object.__setattr__(model, "_expert_parallel", expert_parallel)  # as apply_expert_parallel keeps it
    return expert_parallel
