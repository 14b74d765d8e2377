"""Which groups trained each step, and what a lost group cost (contract/rundir/replicas.py has the format).

Every group in a step follows the same participation (the all-reduce tells each the same), and a loss is written
once: its `replica_lost` line by the lowest group present at its first step, its `replica_rejoined` line by the
lowest group present at every step of it (the one that saw it all: should the first writer be lost meanwhile, the
next takes over). A group that healed into a loss knows nothing of its start and writes nothing of it: one started
again to heal (HEAL_ENV), or one that fell behind and healed in place (its steps jump: a kill inside an all-reduce
that some groups finished leaves those that did not a step behind, and the loss starts at that step for them).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from contract.rundir import replicas as contract
from contract.rundir.events import record_event


class Ledger:
    def __init__(self, run_dir: Path, group: int, groups: int, group_dp: int, micro: int, accum: int) -> None:
        self.run_dir, self.group, self.groups = Path(run_dir), group, groups
        self.group_dp, self.micro, self.accum = group_dp, micro, accum
        self.open: dict[str, Any] | None = None  # the loss being counted: since when, which groups, what they missed
        self.full_steps = self.reduced_steps = 0
        self.last: int | None = None  # the step last counted here
        self.heals = os.environ.get(contract.HEAL_ENV) == "1"

    def step(self, step: int, position: int, present: list[int], writes: bool) -> None:
        """Step `step` (first sample `position`) trained by the groups `present`. `writes`: this rank records."""
        missing = [g for g in range(self.groups) if g not in present]
        late = (self.last is None and self.heals) or (self.last is not None and step > self.last + 1)
        self.last = step
        if not missing:
            self.full_steps += 1
            if self.open is not None:
                self._close(step, writes and self._writer())
            return
        self.reduced_steps += 1
        if self.open is None:
            self.open = {"groups": missing, "lost_step": step, "seen": time.time(), "reduced_steps": 0,
                         "missed": [], "members": set(present), "late": late}
            if writes and not late and bool(present) and self.group == min(present):
                record_event(self.run_dir, contract.LOST, step=step, groups=missing)
        self.open["groups"] = sorted(set(self.open["groups"]) | set(missing))
        self.open["members"] &= set(present)  # the groups present at every step of it
        self.open["reduced_steps"] += 1
        for g in missing:
            self.open["missed"] += contract.group_samples(position, g, self.groups, self.group_dp, self.micro,
                                                          self.accum)

    def _writer(self) -> bool:
        """Whether this group writes the open loss's rejoin: it saw all of it and is the lowest that did."""
        o = self.open
        return o is not None and not o["late"] and bool(o["members"]) and self.group == min(o["members"])

    def discarded(self, interval: list[tuple[int, int]], writes: bool) -> None:
        """A DiLoCo sync whose commit vote failed: its interval's steps (step, first sample) trained nothing. Each
        group writes its own share (the groups' votes may differ)."""
        if interval:
            self.last = interval[-1][0]  # counted, as not trained: the next step is no jump
        if not writes or not interval:
            return
        missed = [r for _, position in interval for r in contract.group_samples(
            position, self.group, self.groups, self.group_dp, self.micro, self.accum)]
        record_event(self.run_dir, contract.DISCARDED, group=self.group, steps=[interval[0][0], interval[-1][0]],
                     missed_samples=contract.merge_ranges(missed))

    def _close(self, step: int | None, writer: bool) -> None:
        assert self.open is not None
        o, self.open = self.open, None
        if writer:
            record_event(self.run_dir, contract.REJOINED, groups=o["groups"], lost_step=o["lost_step"],
                         rejoined_step=step, reduced_steps=o["reduced_steps"], seen=o["seen"],
                         heal_s=round(time.time() - o["seen"], 3) if step is not None else None,
                         missed_samples=contract.merge_ranges(o["missed"]))

    def close(self, writes: bool, present: list[int]) -> None:
        """At the run's end: a loss still open is written with no rejoin."""
        if self.open is not None:
            self._close(None, writes and self._writer())
