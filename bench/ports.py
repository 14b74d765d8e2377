"""A rendezvous store for a benchmark's ranks, hosted by the benchmark's process on a port the OS gives it as it
binds (port 0), as torchrun's agent hosts one; the ranks join it as clients (train/distributed.py AGENT_STORE_ENV).
A port picked ahead with a throw-away socket could be taken by another process first (tests/dist/store.py does
the same for the tests)."""

from __future__ import annotations

import os

import torch.distributed as dist

from train.distributed import AGENT_STORE_ENV, hosted_store

_KEPT: list[dist.TCPStore] = []


def hosted_port(world: int) -> int:
    """The port of a new store for `world` ranks, held by this process; the ranks it spawns (which inherit its
    environment) join it as clients. A benchmark process runs nothing else, so the setting stays with it."""
    store = hosted_store(world)
    _KEPT.append(store)
    os.environ[AGENT_STORE_ENV] = "True"
    return int(store.port)
