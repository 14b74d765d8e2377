"""parallel.replica_groups in the plan: what it refuses (one line each, before anything starts) and what it shows.

Refused: groups that don't divide the data-parallel ranks, or leave a group ranks that parallel.ep does not divide;
DeepSpeed (its engine owns the optimizer step, which the cross-group average and the commit vote must come before);
on SLURM, groups that don't split cluster.nodes into whole nodes (launcher/plan/replica_slurm_plan.py); a
parallel.lighthouse that does not answer. Tensor, pipeline, context and expert parallelism run inside each group as
without groups: the data-parallel ranks are split, so every group holds whole model-parallel blocks laid out alike,
and rank r of each group holds the same shards (the cross-group average and a heal pair rank r with rank r).
optim.outer=diloco (train/replicas/diloco.py) is refused without replica groups, and when trainer.max_steps is not a
whole number of optim.sync_every intervals (the last steps would end unsynced, each group with its own weights).
"""

from __future__ import annotations

import socket
from typing import Any

from contract.errors import ConfigError
from contract.rundir.replicas import live_groups
from launcher.plan.replica_slurm_plan import array_line, check_slurm_groups, lighthouse_mode, lighthouse_where

DEEPSPEED = ("zero1", "zero2", "zero3", "zero3_offload")


def reachable(address: str, timeout_s: float = 2.0) -> bool:
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def check_lighthouse(address: str) -> None:
    if not address.rpartition(":")[2].isdigit():
        raise ConfigError(f"parallel.lighthouse={address} is not host:port (for example n1:29510)")
    if not reachable(address):
        raise ConfigError(f"parallel.lighthouse={address} does not answer: start the lighthouse (torchft_lighthouse "
                          "--min_replicas 1) or drop parallel.lighthouse to have the launcher start one")
    busy = live_groups(address)
    if busy:  # torchft forms one quorum per lighthouse: two runs on one would average each other's gradients
        raise ConfigError(f"parallel.lighthouse={address} already serves another run's replica groups "
                          f"({', '.join(f'group_{g}' for g in sorted(busy))} heartbeat there), and a lighthouse forms "
                          "one quorum: give this run a lighthouse of its own (drop parallel.lighthouse, or start "
                          "another torchft_lighthouse), or wait for that run to end (this run's own groups, just "
                          "stopped, leave it within its heartbeat timeout)")


OUTERS = ("none", "diloco")


def check_outer(cfg: Any, groups: int) -> None:
    """optim.outer: what it names, that replica groups exist to run it, and that every interval is whole."""
    outer = str(cfg.optim.get("outer", "none"))
    if outer not in OUTERS:
        raise ConfigError(f"optim.outer={outer} is not one of {', '.join(OUTERS)}: set optim.outer=diloco or drop it")
    if outer == "none":
        return
    if groups <= 1:
        raise ConfigError("optim.outer=diloco averages across replica groups and there is one: set "
                          "parallel.replica_groups=N (N > 1, dividing the data-parallel ranks), or drop optim.outer")
    every, steps = int(cfg.optim.sync_every), int(cfg.trainer.max_steps)
    if every < 1:  # the schema's range refuses it first; kept for a config built without the launcher's checks
        raise ConfigError(f"optim.sync_every={every} must be at least 1: set optim.sync_every=H (steps between syncs)")
    if steps % every:
        lower, upper = steps - steps % every, steps - steps % every + every
        fix = f"trainer.max_steps={upper}" + (f" or {lower}" if lower else "")
        raise ConfigError(f"trainer.max_steps={steps} is not a multiple of optim.sync_every={every}: its last "
                          f"{steps % every} step(s) would end unsynced, each group with its own weights: set {fix}, "
                          "or an optim.sync_every that divides it")


def check_replica_groups(cfg: Any, dp: int) -> None:
    p = cfg.parallel
    groups = int(p.get("replica_groups", 1))
    check_outer(cfg, groups)
    if groups <= 1:
        if p.get("lighthouse"):
            raise ConfigError("parallel.lighthouse is read only with parallel.replica_groups > 1: drop it, or set "
                              "parallel.replica_groups")
        return
    name = str(cfg.strategy.name)
    if name in DEEPSPEED:
        raise ConfigError(f"parallel.replica_groups does not work with strategy={name}: DeepSpeed's engine steps "
                          "the optimizer itself, before the groups could average: use strategy=fsdp or strategy=ddp")
    check_slurm_groups(cfg, groups)  # on SLURM first: its fix is cluster.nodes, not local.nproc
    if dp % groups:
        more = "cluster.nodes (or cluster.tasks_per_node)" if cfg.get("cluster") is not None else "local.nproc"
        raise ConfigError(f"parallel.replica_groups={groups} does not divide the {dp} data-parallel ranks: pick a "
                          f"divisor of {dp}, or set {more} to a multiple of {groups}")
    ep, pool = int(p.get("ep", 1)), dp // groups * int(p.get("cp", 1))
    if ep > 1 and pool % ep:  # a group takes its experts' ranks from its own data- and context-parallel ranks
        raise ConfigError(f"parallel.ep={ep} does not divide a replica group's {pool} data-parallel ranks, which its "
                          f"experts are split over: pick an ep that divides {pool}, or fewer parallel.replica_groups")
    if lighthouse_mode(cfg) == "given":
        check_lighthouse(str(p.lighthouse))


def replica_lines(cfg: Any, dp: int, world: int, global_batch: int) -> tuple[str, ...]:
    """The plan's lines: the groups, the per-group batch, the lighthouse, what a lost group costs."""
    p = cfg.parallel
    groups = int(p.get("replica_groups", 1))
    if groups <= 1:
        return ()
    where = lighthouse_where(cfg)
    o = cfg.optim
    across = (f"DiLoCo: each group steps optim={o.name} alone, every {int(o.sync_every)} steps the groups' "
              f"pseudo-gradients averaged through torchft and applied by SGD (lr {float(o.outer_lr):g}, momentum "
              f"{float(o.outer_momentum):g}{', Nesterov' if o.outer_nesterov else ''})"
              if o.get("outer", "none") == "diloco" else "gradients averaged across groups through torchft")
    ranks, group_dp = world // groups, dp // groups
    inner = "" if ranks == group_dp and int(p.get("ep", 1)) == 1 else f" (each: {inner_layout(cfg, group_dp)})"
    return (f"replica groups: {groups} of {ranks} rank(s){inner}, each its own process group, {across}; "
            f"each group reads {global_batch // groups} of the {global_batch} "
            "sequences of every step",
            *array_line(cfg, groups, ranks),
            f"lighthouse {where}; heartbeat timeout {int(p.replica_heartbeat_timeout_ms)} ms, join timeout "
            f"{int(p.replica_join_timeout_ms)} ms",
            f"a lost group: the others go on at {groups - 1}/{groups} of the batch (its samples of those steps are "
            "not trained, and events.jsonl names them) until it is restarted and heals from a live group"
            + (" at the next sync; a sync that fails (a group lost during it) discards its interval"
               if o.get("outer", "none") == "diloco" else ""))


def inner_layout(cfg: Any, group_dp: int) -> str:
    """A group's layout in the plan's words: the model-parallel degrees and its data-parallel ranks (the experts'
    ranks, parallel.ep, are some of those)."""
    p = cfg.parallel
    parts = [f"{k} {int(p.get(k, 1))}" for k in ("tp", "pp", "cp") if int(p.get(k, 1)) > 1]
    ep = int(p.get("ep", 1))
    return " x ".join([*parts, f"dp {group_dp}"]) + (f", the experts split over ep {ep}" if ep > 1 else "")
