"""One torchft Manager per rank (train/replicas/__init__.py): its store, its lighthouse, the start barrier, and the
state a healing group takes from a live one.

The state sent to a healing group is every tensor this rank holds as a plain local tensor (an FSDP2 shard's local
part, an optimizer moment's), the schedule's state and the trainer's counters; it is loaded by copying into the
tensors in place, so that the wrapped model and its optimizer keep their own objects. torchft's own report of a peer
lost mid-all-reduce (an exception and its traceback on every survivor) is turned into one warning line.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from contract.errors import ConfigError
from contract.rundir import replicas as contract
from train.observe.metrics import log
from train.replicas.peers import slurm_array, waiting_file

# A SLURM task started again waits this long at most for the groups that resume from its step (a whole-array
# resume); the rest, late in the queue or resuming from another checkpoint, heal from a live group when they start.
RESUME_WAIT_S = 120.0
# The commit vote's timeout, in parallel.replica_timeout_s (make_manager says why).
VOTE_TIMEOUTS = 2


def _local(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return (t.to_local() if hasattr(t, "to_local") else t).detach()
    return t


def held_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               trainer: dict[str, Any]) -> dict[str, Any]:
    """What a healing peer needs from this rank, as local tensors (a copy is not made: torchft serves them before
    the next optimizer step changes them)."""
    tensors = {n: _local(t) for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    saved = optimizer.state_dict()
    optim = {i: {k: _local(v) for k, v in s.items()} for i, s in saved["state"].items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in saved["param_groups"]]
    return {"tensors": tensors, "optim": optim, "groups": groups, "scheduler": scheduler.state_dict(),
            "trainer": dict(trainer)}


def load_held_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    state: dict[str, Any]) -> dict[str, Any]:
    """Copy a peer's held_state into this rank's tensors in place; returns the trainer's counters."""
    with torch.no_grad():
        for n, t in list(model.named_parameters()) + list(model.named_buffers()):
            _local(t).copy_(state["tensors"][n])
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, saved in state["optim"].items():
            own = optimizer.state[params[int(i)]]
            for k, v in saved.items():
                if isinstance(v, torch.Tensor) and isinstance(own.get(k), torch.Tensor):
                    _local(own[k]).copy_(v)
                else:
                    own[k] = v
    for group, saved_group in zip(optimizer.param_groups, state["groups"], strict=True):
        group.update(saved_group)
    scheduler.load_state_dict(state["scheduler"])
    return dict(state["trainer"])


class _PeerLossLine(logging.Filter):
    """torchft logs a peer group lost inside a cross-group all-reduce as an exception with its traceback, on every
    survivor, at every loss. Here that is expected and handled (the commit vote discards the step, which is trained
    again), so it becomes one warning line saying so, with the error's first line and no traceback."""

    MARK = "got exception waiting for work"

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and self.MARK in text:
            prefix, _, error = text.partition(self.MARK)
            first = error.strip().splitlines()[0] if error.strip() else "no message"
            record.msg = (f"{prefix}a peer group was lost during this step's cross-group all-reduce ({first[:300]}): "
                          "the step is discarded and trained again")
            record.args, record.exc_info, record.exc_text = (), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_peer_losses() -> None:
    """Once per process: torchft's manager logger gets _PeerLossLine."""
    logger = logging.getLogger("torchft.manager")
    if not any(isinstance(f, _PeerLossLine) for f in logger.filters):
        logger.addFilter(_PeerLossLine())


def lighthouse_address(cfg: Any) -> str | None:
    """The run's lighthouse: the one the launcher started (its environment) or parallel.lighthouse."""
    return os.environ.get(contract.LIGHTHOUSE_ENV) or getattr(cfg.parallel, "lighthouse", None)


def heal_patience_s(parallel: Any) -> tuple[float, float]:
    """How long a group started to heal asks the lighthouse again for a live group ahead of it (session.py), and the
    pause between asks: as long as a live group can be kept from a quorum. It may be held in the commit vote of a step
    with the lost group (VOTE_TIMEOUTS collective timeouts), then wait out the join timeout, its heartbeat a timeout
    late. The pause is half a heartbeat timeout: a live group that asks meanwhile waits for this one at the
    lighthouse (this group heartbeats and the last quorum was its own), and gets it at the next ask."""
    heartbeat = float(parallel.replica_heartbeat_timeout_ms) / 1000
    patience = VOTE_TIMEOUTS * float(parallel.replica_timeout_s) + float(parallel.replica_join_timeout_ms) / 1000
    return patience + heartbeat, min(1.0, heartbeat / 2)


def make_manager(cfg: Any, env: Any, device: torch.device, group: int,
                 load_fn: Callable[[Any], None], save_fn: Callable[[], Any]) -> tuple[Any, Any]:
    """The Manager of this rank of replica group `group`, and the store it uses when the group has one rank (held by
    the caller). Only the group's rank 0 runs the ManagerServer that talks to the lighthouse."""
    try:
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
    except ImportError as err:
        raise ConfigError("parallel.replica_groups needs torchft: pip install -e .[ft]") from err
    quiet_peer_losses()
    p = cfg.parallel
    timeout = timedelta(seconds=int(p.replica_timeout_s))
    store = None
    if env.world_size == 1:  # no group store exists: one of its own, for the Manager to find its server through
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
        addr, port = "127.0.0.1", int(store.port)
    else:
        addr, port = env.master_addr, int(env.master_port)
    pg = ProcessGroupNCCL(timeout=timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=timeout)
    lighthouse = lighthouse_address(cfg)
    # The commit vote waits for every rank of the group, and they reach it up to a collective's timeout apart: one
    # whose all-reduce failed at once (a lost peer's socket closed) and one that waited the timeout out (a peer that
    # never answers, a frozen rank, a group stuck in its own collective). With torchft's one timeout for both, the
    # first rank's vote timed out, and a live group crashed on a loss elsewhere; twice the collective's timeout here.
    # A rank of this group that never votes (frozen) still ends the group, after that.
    vote = VOTE_TIMEOUTS * timeout

    class VotingManager(Manager):  # type: ignore[misc, valid-type]
        def should_commit(self, timeout: timedelta | None = None) -> bool:
            return bool(super().should_commit(timeout or vote))

    manager = VotingManager(
        pg=pg, load_state_dict=load_fn, state_dict=save_fn, min_replica_size=1,
        use_async_quorum=False,  # the async quorum reads state_dict() while FSDP2's forward frees its parameters
        timeout=timeout, quorum_timeout=timedelta(seconds=int(p.replica_quorum_timeout_s)), connect_timeout=timeout,
        rank=env.rank, world_size=env.world_size, store_addr=addr, store_port=port, lighthouse_addr=lighthouse,
        replica_id=f"group_{group}",  # torchft reads the trailing digits as the group's index
        hostname=socket.gethostname(), init_sync=False,  # every group seeds its weights alike
    )
    return manager, store


def start_barrier(run_dir: Path, launch: str, group: int, groups: int, timeout_s: float, is_main: bool,
                  lighthouse: str | None = None) -> None:
    """Every rank, once its Manager exists (rank 0's heartbeats): wait until every group's rank 0 is there, so that
    the first quorum holds them all (one formed without a group that is still starting would make it heal at once,
    and the run would differ from a plain one). A group is there once the lighthouse hears its heartbeat (the
    Manager's first one follows its construction by a moment: a group whose ready file came first was once left out
    of a loaded host's first quorum). The other ranks wait too: their first quorum call, timed from its start,
    would otherwise run out while rank 0 waits here."""
    mine, waiting = contract.ready_file(run_dir, launch, group), waiting_file(run_dir, group)
    found = slurm_array()
    resuming = found is not None and found[1] > 0  # a SLURM task started again: go on without the late ones
    deadline = time.monotonic() + (min(timeout_s, RESUME_WAIT_S) if resuming else timeout_s)
    if is_main:
        waiting.parent.mkdir(parents=True, exist_ok=True)
        waiting.touch()  # a group started again meanwhile resumes with it, not heals from it
        _heard(lighthouse, group, deadline)
        mine.parent.mkdir(parents=True, exist_ok=True)
        mine.touch()
    try:
        while not all(contract.ready_file(run_dir, launch, g).exists() for g in range(groups)):
            if time.monotonic() > deadline:
                missing = [g for g in range(groups) if not contract.ready_file(run_dir, launch, g).exists()]
                if resuming:
                    log.warning("replica groups %s did not resume from this step within %.0f s: going on without "
                                "them (they heal from a live group when they start)", missing, RESUME_WAIT_S)
                    return
                raise RuntimeError(f"replica groups {missing} did not start within {timeout_s:.0f} s")
            time.sleep(0.05)
    finally:
        if is_main:
            waiting.unlink(missing_ok=True)


def _heard(lighthouse: str | None, group: int, deadline: float) -> None:
    """Until the lighthouse lists this group's heartbeat (or it cannot be asked, or the deadline passes: the
    barrier's own wait then says what is missing)."""
    while lighthouse and time.monotonic() < deadline:
        live = contract.live_groups(lighthouse, timeout_s=2.0)
        if live is None or group in live:
            return
        time.sleep(0.05)
