"""The device mesh of a tensor x pipeline x data-parallel layout (launcher/plan/parallel.py checks and explains it).

Dimensions, outermost first: data-parallel ("dp", or "dp_replicate" x "dp_shard" for HSDP), pipeline ("pp"),
tensor-parallel ("tp"): rank = ((dp x pp) + stage) x tp + t, so a tensor-parallel group is neighbouring ranks
(one node) and a replica's stages sit on consecutive nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass
class Layout:
    mesh: DeviceMesh
    tp: int
    pp: int
    dp: int
    dp_rank: int
    pp_rank: int
    tp_rank: int

    @property
    def feeds_data(self) -> bool:
        """One rank per data-parallel replica speaks for its samples (traces): tensor-parallel index 0, stage 0."""
        return self.tp_rank == 0 and self.pp_rank == 0

    @property
    def dp_dims(self) -> tuple[str, ...]:
        names = self.mesh.mesh_dim_names or ()
        return tuple(n for n in names if n.startswith("dp"))

    @cached_property
    def pp_group(self) -> Any:
        """The pipeline's process group, looked up once (slicing the mesh builds a sub-mesh on every call)."""
        return self.mesh["pp"].get_group()

    def dp_mesh(self) -> DeviceMesh:
        dims = self.dp_dims
        return self.mesh[dims[0]] if len(dims) == 1 else self.mesh[dims]


def model_parallel(cfg: Any) -> bool:
    return int(cfg.parallel.tp) * int(cfg.parallel.pp) > 1


def build_layout(cfg: Any, env: Any, device_type: str) -> Layout:
    tp, pp = int(cfg.parallel.tp), int(cfg.parallel.pp)
    dp = env.world_size // (tp * pp)
    if cfg.strategy.name == "hsdp":
        nodes = max(1, env.world_size // max(1, env.local_world_size))
        replicate = int(cfg.strategy.replicate_degree or min(nodes, dp))
        mesh = init_device_mesh(device_type, (replicate, dp // replicate, pp, tp),
                                mesh_dim_names=("dp_replicate", "dp_shard", "pp", "tp"))
    else:
        mesh = init_device_mesh(device_type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    dp_rank = env.rank // (tp * pp)
    return Layout(mesh, tp, pp, dp, dp_rank, mesh["pp"].get_local_rank(), mesh["tp"].get_local_rank())
