"""Gradient compression on the ranks: the one seam the strategies call (what each choice means, which strategy takes
which, and what `auto` becomes: contract/rules/grad_compression.py).

DDP registers a communication hook on its buckets (`DDPCompression`): torch's bf16/fp16 compress hooks, or PowerSGD.
FSDP2 takes the compression as its reduce dtype (`reduce_dtype`), for the reduce-scatter and hsdp's all-reduce
across replicas. PowerSGD keeps state between steps on each rank (the error it has not sent yet, the last P and Q, its
step count and random stream): `state_dict` and `load_state_dict` carry it through every checkpoint
(train/checkpoints/manager.py, one file per rank), so that a resumed run sends what the uninterrupted one sent.
"""

from __future__ import annotations

from typing import Any

import torch

from contract.errors import ConfigError
from contract.rules import grad_compression as rules

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def chosen(cfg: Any, env: Any) -> tuple[str, str]:
    """strategy.grad_compression resolved for this run (`auto` by node count and precision), and why."""
    reason = rules.refusal(cfg.strategy)  # the launch refused it; a config.yaml edited by hand gets it here
    if reason:
        raise ConfigError(reason)
    nodes = max(1, env.world_size // max(1, getattr(env, "local_world_size", env.world_size)))
    return rules.resolve(cfg.strategy, cfg.precision.name, nodes)


def reduce_dtype(cfg: Any, env: Any) -> torch.dtype | None:
    """FSDP2's reduce dtype for this run: bf16/fp16 compression, else None (the gradients' own dtype)."""
    return DTYPES.get(chosen(cfg, env)[0])


def powersgd_start(cfg: Any) -> int:
    """The first step PowerSGD compresses: after the learning-rate warmup and the first fifth of the run, never before
    step 2 (PowerSGDState's minimum with error feedback). torch's advice is to start at a tenth of the steps and raise
    it until the loss holds: on the tiny model (bench/grad_compression.py, 200 steps, rank 4) a start after the warmup
    (step 5) left the loss 13% above uncompressed after 200 steps, at step 20 3.2%, at step 40 0.9%."""
    steps = int(cfg.trainer.get("max_steps") or 0)
    return max(2, int(cfg.optim.get("warmup_steps", 0) or 0), steps // 5)


# PowerSGD's state between steps (its other slots are settings, this run's config's).
POWERSGD_STATE = ("rng", "error_dict", "p_memory_dict", "q_memory_dict", "iter", "total_numel_before_compression",
                  "total_numel_after_compression", "next_stats_report")


class DDPCompression:
    """One DDP communication hook and its state. `group`: the ranks DDP averages over (None: the world)."""

    def __init__(self, kind: str, group: Any, cfg: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        self.kind = kind
        self.state: Any = group  # the stateless hooks take the process group as their state
        if kind == "powersgd":
            self.state = powerSGD_hook.PowerSGDState(
                group, matrix_approximation_rank=int(cfg.strategy.powersgd_rank),
                start_powerSGD_iter=powersgd_start(cfg), use_error_feedback=True, warm_start=True)
            self.hook: Any = powerSGD_hook.powerSGD_hook
        elif kind in DTYPES:
            compress = default_hooks.bf16_compress_hook if kind == "bf16" else default_hooks.fp16_compress_hook

            # torch's hook under a name of ours: DDP refuses one named bf16_compress_hook unless CUDA and NCCL are
            # there, and gloo reduces bf16 as well. No annotations: DDP compares them with its own types.
            def compressed_all_reduce(state, bucket):  # type: ignore[no-untyped-def]
                return compress(state, bucket)

            self.hook = compressed_all_reduce
        else:
            raise ValueError(f"strategy.grad_compression={kind} has no DDP hook")

    def register(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        ddp.register_comm_hook(self.state, self.hook)

    def state_dict(self) -> dict[str, Any] | None:
        """PowerSGD's state on this rank (its slots but the process group); None for the stateless hooks."""
        if self.kind != "powersgd":
            return None
        return {"rank": self.state.matrix_approximation_rank,
                **{slot: getattr(self.state, slot) for slot in POWERSGD_STATE}}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """The saved state; P and Q of another strategy.powersgd_rank are left behind (a fresh start for them)."""
        if self.kind != "powersgd" or not state:
            return
        for slot in POWERSGD_STATE:
            if slot in state and (state.get("rank") == self.state.matrix_approximation_rank
                                  or slot not in ("p_memory_dict", "q_memory_dict")):
                setattr(self.state, slot, state[slot])
