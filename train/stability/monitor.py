"""The host's view of the verdicts: counts, the current run of skipped steps, and what to do (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from train.stability.verdict import NONFINITE, SCALER, SPIKE

# What the ranks agree on (the larger wins): nothing, roll back, stop.
NOTHING, ROLLBACK, STOP = 0, 1, 2


@dataclass
class Trouble:
    """The steps that went wrong, for the decision and the record."""
    action: int
    reason: str
    bad_steps: list[int] = field(default_factory=list)
    limit: str = ""  # why a rollback became a stop


class Monitor:
    def __init__(self, policy: str, skip_limit: int, max_rollbacks: int, rollbacks_done: int) -> None:
        self.policy, self.skip_limit, self.max_rollbacks = policy, skip_limit, max_rollbacks
        self.rollbacks_done = rollbacks_done
        # Steps not applied, for metrics.jsonl: over the steps that made the weights (a checkpoint keeps them, so a
        # resumed run counts on as an uninterrupted one does). scaler_skipped: fp16 overflows (SCALER).
        self.nonfinite = self.spikes = self.scaler_skipped = 0
        self.unreported: list[tuple[int, int]] = []  # (step, code) of skipped steps not yet in events.jsonl
        self.reset()

    def reset(self) -> None:
        """After a rollback: the steps seen since are gone."""
        self.run: list[int] = []  # the current run of skipped steps in a row
        self.tripped: list[int] = []  # the first run that reached skip_limit (kept: later steps don't undo it)
        self.trouble_steps: list[int] = []  # non-finite steps that call for the policy (rollback, stop)
        self.unreported = []

    def observe(self, step: int, code: int) -> None:
        if not code:
            self.run = []
            return
        self.unreported.append((step, code))
        if code & SCALER:
            self.scaler_skipped += 1
            if code == SCALER:  # the loss scaler's routine skip: neither trouble nor part of a run of it
                return
        self.run.append(step)
        if len(self.run) >= self.skip_limit and (not self.tripped or self.tripped[0] == self.run[0]):
            self.tripped = list(self.run)
        if code & NONFINITE:
            self.nonfinite += 1
            if self.policy != "skip":  # under skip only a run of skipped steps calls for anything
                self.trouble_steps.append(step)
        elif code & SPIKE:
            self.spikes += 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (taken at a save, where nothing calls for action): the run of skipped steps in a
        row that the next steps may extend to skip_limit, and the counts."""
        return {"run": list(self.run), "nonfinite": self.nonfinite, "spikes": self.spikes,
                "scaler_skipped": self.scaler_skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        self.run = [int(s) for s in state.get("run", [])]
        self.nonfinite, self.spikes = int(state.get("nonfinite", 0)), int(state.get("spikes", 0))
        self.scaler_skipped = int(state.get("scaler_skipped", 0))

    def action(self) -> int:
        """What the steps seen so far call for."""
        if self.policy == "stop" and self.trouble_steps:
            return STOP
        wanted = (self.policy == "rollback" and self.trouble_steps) or self.tripped
        if not wanted:
            return NOTHING
        return STOP if self.rollbacks_done >= self.max_rollbacks else ROLLBACK

    def trouble(self, action: int) -> Trouble:
        """The steps behind `action`: the run of skipped steps (or the non-finite steps, for rollback/stop)."""
        if self.tripped:
            steps, reason = list(self.tripped), f"{len(self.tripped)} steps in a row not applied"
        else:
            steps, reason = list(self.trouble_steps), "non-finite gradient norm or loss"
        limit = ""
        if action == STOP and self.policy != "stop" and self.rollbacks_done >= self.max_rollbacks:
            limit = f", after {self.rollbacks_done} rollbacks (stability.max_rollbacks={self.max_rollbacks})"
        return Trouble(action, reason, steps, limit)

    def take_unreported(self) -> list[tuple[int, int]]:
        out, self.unreported = self.unreported, []
        return out
