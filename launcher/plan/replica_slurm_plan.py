"""parallel.replica_groups with +cluster: where the groups and the lighthouse go, refused in one line or shown in the
plan (launcher/run/replica_slurm.py submits them; docs/faults.md).

Each group is one task of a SLURM job array on cluster.nodes / N whole nodes of its own, so that SLURM ends and
requeues it alone. The lighthouse (parallel.lighthouse):
    unset      a job of its own (one task, one CPU), submitted first; the array starts after it has started
    login      started on this login node by the launcher, detached, and kept until the array has left the queue
    HOST:PORT  one already running: it must answer now
"""

from __future__ import annotations

from typing import Any

from contract.errors import ConfigError

LOGIN = "login"


def lighthouse_mode(cfg: Any) -> str:
    """"given" (HOST:PORT), "login", "job" (SLURM, unset) or "local" (local.nproc, unset: the launcher's)."""
    given = cfg.parallel.get("lighthouse")
    if given == LOGIN:
        return "login"
    if given:
        return "given"
    return "job" if cfg.cluster is not None else "local"


def check_slurm_groups(cfg: Any, groups: int) -> None:
    """Before anything starts: groups that SLURM can place, and parallel.lighthouse=login only where it means
    something."""
    if cfg.parallel.get("lighthouse") == LOGIN and cfg.cluster is None:
        raise ConfigError("parallel.lighthouse=login starts the lighthouse on the login node of a SLURM run: add "
                          "+cluster=NAME, or drop parallel.lighthouse (locally the launcher starts one)")
    if cfg.cluster is None:
        return
    nodes = int(cfg.cluster.nodes)
    if nodes % groups:
        raise ConfigError(f"parallel.replica_groups={groups} puts each group on whole nodes of its own (one array "
                          f"task each) and cluster.nodes={nodes} does not split into {groups}: set cluster.nodes to a "
                          f"multiple of {groups}")


def lighthouse_where(cfg: Any) -> str:
    """The plan's words for where the lighthouse runs."""
    mode = lighthouse_mode(cfg)
    if mode == "given":
        return f"at {cfg.parallel.lighthouse} (given)"
    if mode == "login":
        return ("started on this login node by the launcher and kept until the array ends (parallel.lighthouse="
                "login; its address in RUN_DIR/lighthouse.json)")
    if mode == "job":
        return ("a job of its own (1 task, 1 CPU), submitted first; the array starts once it runs (its address in "
                "RUN_DIR/lighthouse.json)")
    return "started by the launcher on 127.0.0.1 (its address in RUN_DIR/lighthouse.json)"


def array_line(cfg: Any, groups: int, ranks: int) -> tuple[str, ...]:
    """The array's layout (SLURM only)."""
    if cfg.cluster is None:
        return ()
    nodes = int(cfg.cluster.nodes) // groups
    return (f"job array of {groups} tasks (task k = replica group k), each {nodes} node(s) x {ranks // nodes} "
            "rank(s); a group whose rank fails is ended whole by srun and its task requeues alone, then heals from a "
            "live group (no checkpoint read)",)
