"""A finite blow-up said out loud (issue 27 trial, item 2): a loss that goes far above the run's start without ever
going non-finite is trained on to the end, so rank 0 warns once at the first log step where it is (blowup.py's rule)
and once more at the run's last step if it is still there, each line naming the step and the rate that fits."""

from __future__ import annotations

from contract.rules.blowup import LossHistory, far_above, lr_cut, reference
from train.observe.metrics import log


class BlowupWarning:
    def __init__(self, vocab_size: int | None, margin: float, lr: float, max_steps: int | None, is_main: bool) -> None:
        self.vocab_size, self.margin, self.lr = vocab_size, margin, lr
        self.max_steps, self.is_main = max_steps, is_main
        self.since: int | None = None  # the first step of the stretch of logged losses far above the start
        self.warned = False

    def observe(self, history: LossHistory, step: int, loss: float) -> None:
        """A log step's loss (averaged over the ranks), after `history` took it."""
        ref = reference(history.start, self.vocab_size)
        if ref is None or history.start_step == step or not far_above(loss, ref, self.margin):
            self.since = None
            return
        self.since = step if self.since is None else self.since
        last = self.max_steps is not None and step >= self.max_steps
        if (self.warned and not last) or not self.is_main:
            return
        self.warned = True
        cut = lr_cut(loss, ref)
        start = f"{history.start:.4g} at step {history.start_step}" if history.start is not None else "?"
        where = (f"the run ends with its loss far above its start since step {self.since} ({loss:.4g} at step {step} "
                 f"against {start}" if last else
                 f"step {step}: the loss ({loss:.4g}) went far above its start ({start}")
        log.warning("%s; stability.blowup_margin=%g): the learning rate is too high; start over at optim.lr=%g "
                    "(%dx lower)", where, self.margin, self.lr / cut, cut)
