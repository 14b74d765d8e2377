"""A frozen rank ends its own replica group, so that it never holds the others' quorum (docs/faults.md).

A rank stopped by SIGSTOP, or on a host that hangs, keeps its sockets open and answers nothing. When it is not the
group's rank 0, that rank 0 still heartbeats to the lighthouse (torchft's ManagerServer runs in a thread of it),
and with 2 groups the lighthouse kept waiting for it: the survivors made no step until their own timeouts.

Every rank of a group ticks a counter in the group's store every TICK_S seconds, from a daemon thread and over a
connection of its own with a short timeout. A stopped process ticks no more: every thread of it stops. A rank that
sees a peer's counter stand still for parallel.replica_peer_timeout_s seconds, while its own ticks kept time,
logs one line and exits; the launcher then tears the whole group down (the frozen rank with it) and starts it again
to heal from a live group. A rank that ends normally marks its counter done (-1) first, so that a peer still
finishing its last step or save is not taken for frozen. A store that does not answer (its host, rank 0, is the
frozen one: the lighthouse drops that group by its missing heartbeats) is tried again at the next tick.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

TICK_S = 1.0
DONE = -1
PREFIX = "slurmtrain/alive/"


class PeerLiveness:
    def __init__(self, addr: str, port: int, rank: int, world: int, timeout_s: float, group: int,
                 exit_fn: Any = None, tick_s: float = TICK_S) -> None:
        self.addr, self.port, self.rank, self.world, self.group = addr, port, rank, world, group
        self.timeout_s, self.tick_s = timeout_s, tick_s
        self.ticks = 0  # this rank's own ticks (tests wait on them)
        self.exit_fn = exit_fn or _end_process
        self.stopped = threading.Event()
        self._store: Any = None
        self._seen: dict[int, tuple[int, float]] = {}  # peer -> (its last counter, when it last changed)
        self._last_tick = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="slurmtrain-peer-liveness", daemon=True)

    def start(self) -> PeerLiveness:
        self._thread.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """This rank ends normally: its counter marks it done, and the thread stops."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        try:
            self._connect().set(f"{PREFIX}{self.rank}", str(DONE))
        except Exception:  # noqa: BLE001 - the store's host may have ended first: nothing to tell then
            pass

    def _connect(self) -> Any:
        if self._store is None:
            self._store = dist.TCPStore(self.addr, self.port, is_master=False, wait_for_workers=False,
                                        timeout=timedelta(seconds=max(2.0, self.tick_s * 3)))
        return self._store

    def _run(self) -> None:
        while not self.stopped.wait(self.tick_s):
            try:
                store = self._connect()
                self.ticks += 1
                store.set(f"{PREFIX}{self.rank}", str(self.ticks))
                peers = [p for p in range(self.world) if p != self.rank]
                keys = [f"{PREFIX}{p}" for p in peers]
                values = store.multi_get(keys) if store.check(keys) else None  # None: a peer has not ticked yet
            except Exception:  # noqa: BLE001 - no answer this tick (a frozen store host): try again at the next
                self._last_tick = time.monotonic()
                continue
            now = time.monotonic()
            starved = now - self._last_tick > self.tick_s + self.timeout_s / 2  # this rank ran late: judge nobody
            self._last_tick = now
            if values is None or self.stopped.is_set():
                continue
            for peer, raw in zip(peers, values, strict=True):
                value = int(raw)
                last = self._seen.get(peer)
                if value == DONE or last is None or last[0] != value or starved:
                    self._seen[peer] = (value, now)
                elif now - last[1] > self.timeout_s:
                    self.exit_fn(peer, now - last[1], self)
                    return


def _end_process(peer: int, silent_s: float, liveness: PeerLiveness) -> None:
    print(f"rank {liveness.rank} of replica group {liveness.group}: its rank {peer} has given no sign of life for "
          f"{silent_s:.0f} s (parallel.replica_peer_timeout_s={liveness.timeout_s:g}: frozen, or its host hung); "
          "ending the group so that the other groups go on, and it heals when started again", file=sys.stderr,
          flush=True)
    sys.stdout.flush()
    os._exit(1)


def watch_peers(cfg: Any, env: Any, group: int) -> PeerLiveness | None:
    """Started by every rank of a replica group of more than one rank (one rank has no peer to wait for)."""
    if env.world_size == 1:
        return None
    timeout = float(cfg.parallel.get("replica_peer_timeout_s", 20))
    return PeerLiveness(env.master_addr, int(env.master_port), env.rank, env.world_size, timeout, group).start()
