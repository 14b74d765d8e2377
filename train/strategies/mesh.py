"""The device mesh of a tensor x pipeline x context x data-parallel layout (launcher/plan/parallel.py checks and
explains it).

Dimensions, outermost first: data-parallel ("dp", or "dp_replicate" x "dp_shard" for HSDP), context-parallel
("cp"), pipeline ("pp"), tensor-parallel ("tp"): rank = (((dp x cp) + c) x pp + stage) x tp + t, so a
tensor-parallel group is neighbouring ranks (one node) and a replica's stages sit on consecutive nodes. A
context-parallel group shares its samples (each rank a share of every sequence) and its gradients are averaged
with the data-parallel ones: FSDP shards over dp x cp, as torchtitan's "dp_shard_cp" does.
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
    cp: int = 1
    cp_rank: int = 0
    _grad_mesh: DeviceMesh | None = None

    @property
    def feeds_data(self) -> bool:
        """One rank per data-parallel replica speaks for its samples (traces): tensor-parallel index 0, stage 0,
        context-parallel index 0."""
        return self.tp_rank == 0 and self.pp_rank == 0 and self.cp_rank == 0

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

    def grad_mesh(self) -> DeviceMesh:
        """The ranks whose gradients are averaged (FSDP shards over them): data-parallel, with context-parallel
        folded into the (innermost) shard dimension."""
        if self.cp == 1:
            return self.dp_mesh()
        if self._grad_mesh is None:  # flattened once: a mesh dimension is named once
            dims = self.dp_dims
            shard = self.mesh[(dims[-1], "cp")]._flatten(f"{dims[-1]}_cp")
            self._grad_mesh = shard if len(dims) == 1 else self.mesh[(dims[0], f"{dims[-1]}_cp")]
        return self._grad_mesh


def model_parallel(cfg: Any) -> bool:
    """A layout beyond plain data parallelism: tensor, pipeline or context parallel."""
    p = cfg.parallel
    return int(p.tp) * int(p.pp) * int(p.get("cp", 1)) > 1


def build_layout(cfg: Any, env: Any, device_type: str) -> Layout:
    tp, pp, cp = int(cfg.parallel.tp), int(cfg.parallel.pp), int(cfg.parallel.get("cp", 1))
    dp = env.world_size // (tp * pp * cp)
    if cfg.strategy.name == "hsdp":
        nodes = max(1, env.world_size // max(1, env.local_world_size))
        replicate = int(cfg.strategy.replicate_degree or min(nodes, dp))
        mesh = init_device_mesh(device_type, (replicate, dp // replicate, cp, pp, tp),
                                mesh_dim_names=("dp_replicate", "dp_shard", "cp", "pp", "tp"))
    else:
        mesh = init_device_mesh(device_type, (dp, cp, pp, tp), mesh_dim_names=("dp", "cp", "pp", "tp"))
    dp_rank = env.rank // (tp * pp * cp)
    return Layout(mesh, tp, pp, dp, dp_rank, mesh["pp"].get_local_rank(), mesh["tp"].get_local_rank(), cp,
                  mesh["cp"].get_local_rank())
