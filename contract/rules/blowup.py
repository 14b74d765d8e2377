"""Whether a loss has blown up, and how far (pure stdlib: launcher.status judges metrics.jsonl with it too).

A loss is far above a reference when it exceeds it by more than stability.blowup_margin nats (2.3 = ln 10: a
perplexity ten times the reference's). A difference of cross-entropies is a ratio of perplexities, so the rule reads
the same for any vocabulary. The references are capped at ln(vocab), the loss of a uniform guess, about a random
model's: weights that start far above it are themselves blown (a run started from a diverged run's checkpoint).

    start  the run's first logged loss (its step 1): a loss far above it means the rate is far too high
    best   the lowest loss it logged: a checkpoint far above it is no rollback target and no "good" checkpoint

A loss sitting at ln(vocab) itself (within COLLAPSE_NATS) after the run had been below it, or with a vanishing
gradient norm, is a collapsed model (every next token equally likely, often with no gradient left): no rollback
target and no "good" checkpoint either, though it is never far above the capped reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

# stability.blowup_margin's default (contract/config/schema.py): ln 10, rounded.
DEFAULT_MARGIN = 2.3
# How close to ln(vocab) a loss is "at a uniform guess's": a collapsed model's is ln(vocab) to float precision, while a
# random model's own start differs from it by a few hundredths of a nat (5.47 against ln 257 = 5.549).
COLLAPSE_NATS = 0.01
# A gradient norm this small is none: nothing moves the weights any more.
VANISHING_NORM = 1e-6


@dataclass
class LossHistory:
    """The run's start, best and last loss with their steps, as every rank saw them (the loss averaged over the
    ranks); kept in each checkpoint's trainer state, so that a resumed run judges against the same start."""
    start: float | None = None
    start_step: int | None = None
    best: float | None = None
    best_step: int | None = None
    last: float | None = None  # the newest finite loss
    last_step: int | None = None

    def observe(self, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            return
        if self.start is None:
            self.start, self.start_step = loss, step
        if self.best is None or loss < self.best:
            self.best, self.best_step = loss, step
        self.last, self.last_step = loss, step

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in asdict(LossHistory()).items():
            setattr(self, key, state.get(key, value))


def ceiling(vocab_size: int | None) -> float:
    """ln(vocab): the loss of a uniform guess over the vocabulary (inf when the vocabulary is unknown)."""
    return math.log(vocab_size) if isinstance(vocab_size, int) and vocab_size > 1 else math.inf


def reference(loss: float | None, vocab_size: int | None) -> float | None:
    """A start or best loss as a reference, capped at ln(vocab) (ln(vocab) alone when the loss is not known yet);
    None when neither is known."""
    known = [x for x in (loss, ceiling(vocab_size)) if x is not None and math.isfinite(x)]
    return min(known) if known else None


def far_above(loss: float | None, ref: float | None, margin: float) -> bool:
    """Whether `loss` is more than `margin` nats above `ref` (a non-finite loss is; with no reference, none is)."""
    if loss is None or ref is None:
        return False
    return not math.isfinite(loss) or loss > ref + margin


def collapsed(loss: float | None, best: float | None, vocab_size: int | None,
              grad_norm: float | None = None) -> bool:
    """Whether `loss` sits at a uniform guess's, ln(vocab), after the run had been below it (`best`), or with a
    vanishing gradient norm: a model collapsed to predicting every token alike."""
    ceil = ceiling(vocab_size)
    if loss is None or not math.isfinite(loss) or not math.isfinite(ceil) or abs(loss - ceil) > COLLAPSE_NATS:
        return False
    learned = best is not None and best < ceil - COLLAPSE_NATS
    return learned or (grad_norm is not None and math.isfinite(grad_norm) and grad_norm <= VANISHING_NORM)


def lr_cut(loss: float, start_ref: float) -> int:
    """How many times lower the rate should be for a loss that blew far above the run's start: the power of ten
    nearest the factor the loss grew by, at least 10 (797 against 8.3: 100)."""
    grown = loss / start_ref if start_ref > 0 and math.isfinite(loss) else math.inf
    return int(10 ** max(1, min(6, round(math.log10(grown)) if math.isfinite(grown) else 6)))


def far_above_since(losses: Iterable[tuple[int, float]], ref: float | None, margin: float) -> int | None:
    """The first step of the losses far above `ref` that `losses` ((step, loss), in order) ends with: None when the
    last one is not (launcher.status: a run whose loss is far above its start)."""
    since = None
    for step, loss in losses:
        since = (step if since is None else since) if far_above(loss, ref, margin) else None
    return since
