"""Replica groups over torchft (parallel.replica_groups; docs/faults.md): the compute side.

    session.py     Replicas: what the loop calls (a step's quorum, the commit, the ledger); open_replicas builds it
    manager.py     one torchft Manager per rank: its store, its lighthouse, the start barrier, the heal's state
    averaging.py   the cross-group all-reduce of the gradients (one flat buffer a dtype), and who took part
    stops.py       who stops when: a stop every group of the quorum asked for together, one only some asked for alone
    diloco.py      optim.outer=diloco: the global weights, the outer SGD on the averaged pseudo-gradients, its state
    ledger.py      which groups trained each step; what a lost group cost, into events.jsonl
    peers.py       on SLURM (a group per array task): the lighthouse's address, the launch, whether to heal, a lighthouse gone
    task_end.py    on SLURM, after srun: a group whose rank died without a word is recorded and its task requeued
    liveness.py    every rank ticks in its group's store; a peer that stops ticking (frozen) ends the group

torchft 0.2.0 is pinned (the extra `ft`); three of its traps are avoided here: gradients are averaged with
manager.allreduce directly (its DDP wrapper crashes the survivor when a peer dies mid-all-reduce), the quorum is
synchronous (the async one races FSDP2's forward), and a group is torn down whole by its launcher
(launcher/run/replica_groups.py; on SLURM srun's --kill-on-bad-exit), so that a live rank 0 never holds the quorum
for a dead peer (or, through liveness.py, a frozen one).
"""

from train.replicas.session import Replicas, open_replicas

__all__ = ["Replicas", "open_replicas"]
