"""Rank, world and master address from SLURM, torchrun or local mode -> process group and device."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Ports derived from the job id stay in this range, clear of the ephemeral range most kernels use.
MASTER_PORT_RANGE = (20000, 29999)
# Local runs: the launcher binds and listens on MASTER_PORT itself (port 0: the OS picks a free one as it binds) and
# hands rank 0 the listening socket's descriptor under this name; rank 0 hosts the TCPStore on it. No port is ever
# picked ahead and released, so no other process can take it in between (torchrun's agent holds its store the same
# way). launcher/run/local.py sets it.
STORE_FD_ENV = "SLURMTRAIN_STORE_FD"
# Set by whoever hosts the store for the ranks (torchrun's agent; the dist tests' parent process): every rank,
# rank 0 included, joins it as a client.
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # slurm | torchrun | local | single
    node: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def tag(self) -> str:
        return f"[rank {self.rank}/{self.world_size} {self.node}]"


def master_port_for_job(job_id: str) -> int:
    """A port that is the same on every task of one job and differs between jobs sharing a node."""
    return random.Random(f"slurmtrain-{job_id}").randint(*MASTER_PORT_RANGE)


def first_host(nodelist: str) -> str:
    # submitit already parses SLURM's compressed node lists ("n[1-3,7]"); reuse it rather than a regex of ours.
    from submitit.slurm.slurm import _parse_node_list

    return _parse_node_list(nodelist)[0]


def detect(environ: dict[str, str] | None = None) -> DistEnv:
    env = dict(os.environ if environ is None else environ)
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    if "RANK" in env and "WORLD_SIZE" in env:
        # torchrun and our local mode both export the torch env:// variables.
        return DistEnv(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env["WORLD_SIZE"]),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
            launcher=env.get("SLURMTRAIN_LAUNCHER", "torchrun"),
            node=node,
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
        job_id = env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"]) + "_" + env.get("SLURM_ARRAY_TASK_ID", "")
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            world_size=world,
            local_world_size=max(1, world // max(1, nodes)),
            master_addr=first_host(env.get("SLURM_STEP_NODELIST", env["SLURM_JOB_NODELIST"])),
            master_port=int(env.get("MASTER_PORT") or master_port_for_job(job_id)),
            launcher="slurm",
            node=node,
        )
    return DistEnv(0, 0, 1, 1, "127.0.0.1", 29500, "single", node)


def pick_backend(requested: str | None) -> str:
    if requested:
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def device_for(env: DistEnv, backend: str) -> torch.device:
    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_process_group(env: DistEnv, backend: str, timeout_s: int = 600) -> None:
    # torch's own helpers (init_device_mesh for FSDP, even on one rank) read these; SLURM and local modes do not
    # set all of them.
    for key, value in (("RANK", env.rank), ("WORLD_SIZE", env.world_size), ("LOCAL_RANK", env.local_rank),
                       ("MASTER_ADDR", env.master_addr), ("MASTER_PORT", env.master_port)):
        os.environ.setdefault(key, str(value))
    if env.world_size == 1 or dist.is_initialized():
        return
    dist.init_process_group(backend=backend, store=rendezvous_store(env, timeout_s), rank=env.rank,
                            world_size=env.world_size, timeout=timedelta(seconds=timeout_s))


def rendezvous_store(env: DistEnv, timeout_s: int, environ: dict[str, str] | None = None) -> dist.TCPStore:
    """The TCPStore the ranks meet at. Local runs: rank 0 hosts it on the socket the launcher bound and holds
    (STORE_FD_ENV). A store hosted outside the ranks (AGENT_STORE_ENV): every rank is a client. Otherwise (SLURM,
    where each task derives the same port from the job id): rank 0 binds MASTER_PORT as it creates the store,
    nobody picks it ahead, and the others connect to it, retrying until the timeout."""
    environ = dict(os.environ if environ is None else environ)
    timeout = timedelta(seconds=timeout_s)
    listen_fd = environ.get(STORE_FD_ENV)
    hosted_elsewhere = environ.get(AGENT_STORE_ENV, "").lower() in ("1", "true")
    if env.rank == 0 and listen_fd and not hosted_elsewhere:
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=True, timeout=timeout,
                             wait_for_workers=False, master_listen_fd=int(listen_fd))
    return dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                         is_master=env.rank == 0 and not hosted_elsewhere, timeout=timeout, wait_for_workers=False)


def hosted_store(world: int, timeout_s: int = 300) -> dist.TCPStore:
    """A store for `world` ranks hosted by this process on a port the OS gives it as it binds (port 0), as torchrun's
    agent hosts one: the ranks join it as clients (AGENT_STORE_ENV). Tests and benchmarks that spawn ranks use it;
    the store lives as long as the object does."""
    return dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def nccl_env(cluster: Any, run_dir: Path) -> dict[str, str]:
    """torch's NCCL failure handling, from the cluster config: error handling, heartbeat, flight recorder."""
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": str(cluster.nccl_async_error_handling),
        "TORCH_NCCL_ENABLE_MONITORING": "1" if cluster.nccl_heartbeat_timeout_s > 0 else "0",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(cluster.nccl_heartbeat_timeout_s),
    }
    if cluster.nccl_flight_recorder_entries > 0:
        env.update({
            "TORCH_NCCL_TRACE_BUFFER_SIZE": str(cluster.nccl_flight_recorder_entries),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(Path(run_dir) / "hangs" / "nccl_trace_rank_"),
        })
    return env


def apply_nccl_env(cluster: Any, run_dir: Path, backend: str) -> None:
    """Before the process group exists (torch reads them then); what cluster.env sets wins."""
    if backend != "nccl" or cluster is None:
        return
    (Path(run_dir) / "hangs").mkdir(parents=True, exist_ok=True)
    for key, value in nccl_env(cluster, run_dir).items():
        os.environ.setdefault(key, value)


def set_collective_timeout(timeout_s: float) -> None:
    """Shorten (or lengthen) the default group's collective timeout after start-up: long while ranks load and
    compile, short once steps run. A backstop behind the watchdog; torch's private setter, where it exists."""
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is not None and dist.is_initialized() and dist.get_world_size() > 1:
        setter(timedelta(seconds=timeout_s), None)


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


def all_reduce_max(value: int, device: torch.device, group: Any = None) -> int:
    """The largest value any rank holds, on every rank (one tiny all-reduce; on `group` if given)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    t = torch.tensor([value], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def cpu_group() -> Any:
    """A group for small CPU-side agreements: the default one when it is gloo, else a new gloo group, so that
    agreeing never touches the accelerator (no device sync). Collective: every rank calls it, in the same order.
    None when there is nothing to agree with."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    return None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")


def gather_hosts(env: DistEnv) -> list[str]:
    """Node name of every rank, in rank order."""
    if not (dist.is_initialized() and env.world_size > 1):
        return [env.node]
    hosts: list[str | None] = [None] * env.world_size
    dist.all_gather_object(hosts, env.node)
    return [str(h) for h in hosts]
