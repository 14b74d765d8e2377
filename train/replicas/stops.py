"""Who stops when, across replica groups: a stop every group of the quorum asked for is taken together; one that
only some groups asked for is taken by those groups alone, after a short wait for the others.

A group's ranks agree on a stop first (train/faults/preemption.py: SIGTERM stop, the preemption signal stop and
requeue); the group then sends what it asked for with every cross-group exchange (averaging.py: each step's
all-reduce, or DiLoCo's syncs), and every group hears the same asks from it.

- Every group of the quorum asked (a whole-array scancel, a preemption or a time limit: SLURM signals the tasks
  within about a second, at slightly different steps): every group stops at the exchange where the last ask arrived,
  with the largest kind asked (a requeue wins), so that a whole-run resume is exact.
- Only some asked (one array task preempted or cancelled, a stale step cancel that reached one task): each of those
  waits ALONE_WAIT_S from its own agreement for the others to ask too, then checkpoints and stops alone at the next
  exchange (requeued for the preemption signal, as always) and leaves the quorum. The others train on without it, as
  past a lost group, and it heals from a live group when it starts again (peers.py; locally the launcher starts it
  again: launcher/run/replica_groups.py).

ALONE_WAIT_S is a constant, not a key. It covers how far apart SLURM's signals to an array's tasks arrive (about a
second, a property of the cluster, not of the run), and it must stay well inside the grace a stop has to save in
(SIGTERM: KillWait, 30 s by default; the preemption signal: cluster.signal_lead_s, 90 s). A run has no reason to trade
one against the other: longer only eats the save's grace, shorter splits a whole-array stop into lone ones (and its
resume would no longer be exact). The decision is taken only at an exchange, so under DiLoCo a lone stop waits for
the first sync after the wait (at most two intervals after the signal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from train.faults.preemption import NOTHING, REQUEUE

ALONE_WAIT_S = 5.0
TOGETHER, ALONE = "together", "alone"


@dataclass(frozen=True)
class Asks:
    """What one exchange carried: the stop kind each group asked for (groups that asked none are absent) and how
    many groups took part in it (the quorum)."""

    kinds: dict[int, int] = field(default_factory=dict)
    quorum: int = 0

    @property
    def every_group(self) -> bool:
        return bool(self.kinds) and len(self.kinds) >= self.quorum


class StopRule:
    """One group's view: what it asked for, since when, and the asks of the newest exchange not yet decided on."""

    def __init__(self, group: int, wait_s: float = ALONE_WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.group, self.wait_s, self.clock = group, wait_s, clock
        self.pending = NOTHING  # what this group's ranks agreed on, sent with every exchange from then on
        self.asked_at: float | None = None
        self.heard_asks: Asks | None = None  # the newest exchange's, until decide() has looked at it
        self.last = Asks()  # the newest exchange's, decided on or not
        self.seen: set[int] = set()  # the groups already known to have asked (for the log)
        self.waited_s = 0.0

    def ask(self, kind: int) -> bool:
        """This group's agreed stop at a step boundary; True the first time it asks."""
        first = kind != NOTHING and self.pending == NOTHING
        if first:
            self.asked_at = self.clock()
        self.pending = max(self.pending, kind)
        return first

    def heard(self, asks: Asks) -> None:
        """An exchange took place (a step's all-reduce, a DiLoCo sync) and committed."""
        self.heard_asks = self.last = asks

    def newly_asked(self) -> list[int]:
        """The groups whose ask the newest exchange carried for the first time (each said once)."""
        kinds = self.heard_asks.kinds if self.heard_asks is not None else {}
        new = sorted(set(kinds) - self.seen)
        self.seen |= set(kinds)
        return new

    def decide(self, agree: Callable[[bool], bool]) -> tuple[str | None, int]:
        """At a step boundary, after ask(): (TOGETHER, kind), (ALONE, kind) or (None, NOTHING). Decides only on an
        exchange it has not decided on, so that every group decides on the same asks. `agree(expired) -> bool`: the
        group's ranks' agreement that the wait is over (any rank's clock says so); called only while this group
        waits, on every rank of it alike."""
        asks, self.heard_asks = self.heard_asks, None
        if asks is None or not asks.kinds:
            return None, NOTHING
        if asks.every_group:
            return TOGETHER, max(asks.kinds.values())
        if self.group not in asks.kinds or self.asked_at is None:
            return None, NOTHING  # others wait for this group: it goes on until it is asked too, or they leave
        self.waited_s = self.clock() - self.asked_at
        if agree(self.waited_s >= self.wait_s):
            return ALONE, asks.kinds[self.group]
        return None, NOTHING


def kind_name(kind: int, preempt: str) -> str:
    """The signal behind a stop kind, in words: SIGTERM, or the cluster's preemption signal."""
    return f"SIG{preempt.upper().removeprefix('SIG')}" if kind == REQUEUE else "SIGTERM"
