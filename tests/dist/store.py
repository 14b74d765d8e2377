"""A rendezvous store for spawned test ranks, hosted by the test process on a port the OS gives it as it binds
(port 0), as torchrun's agent hosts one: the ranks join it as clients (train/distributed.py AGENT_STORE_ENV, set by
their `_join`). A port picked ahead with a throw-away socket could be taken by another process before rank 0 binds
it again (EADDRINUSE under a loaded machine)."""

from __future__ import annotations

import torch.distributed as dist

from train.distributed import hosted_store

# The stores of the latest spawns, kept alive while their ranks may still use them (a store closes when collected).
_KEPT: list[dist.TCPStore] = []
KEEP = 8


def hosted_port(world: int) -> int:
    """The port of a new store for `world` ranks, held by this process."""
    store = hosted_store(world)
    _KEPT.append(store)
    del _KEPT[:-KEEP]
    return int(store.port)
