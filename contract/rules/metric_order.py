"""Which way a measured metric is better: the one rule that checkpoint.keep_best, `--best` and a sweep's ranking
(launcher.status, launcher.report, a local sweep's table) all follow. Pure stdlib.

A metric is a key of metrics.jsonl's rows or of an evaluation result (eval/step_N.json): `val/NAME/loss`,
`val/NAME/ppl`, `harness/TASK/METRIC` (lm-evaluation-harness scores; anything after a `,` or a further `/` is the
metric's filter), the training `loss`, `loss_avg`. Its direction comes from its name (METRIC of a harness key, the last
part of any other): losses, perplexities and error rates are lower-is-better, accuracies and scores higher-is-better,
as lm-evaluation-harness declares them for its own metrics. A name that is neither is refused unless it says its
direction: `METRIC:max` (higher is better) or `METRIC:min`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contract.errors import ConfigError

# lm-evaluation-harness's metrics that are lower-is-better (its registry's higher_is_better=False), and ours.
LOWER = frozenset({"loss", "loss_avg", "ppl", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte",
                   "ter", "wer", "cer", "brier_score", "mse", "mae", "rmse", "error", "error_rate", "z_loss"})
# ... and higher-is-better: accuracies and scores.
HIGHER = frozenset({"acc", "acc_norm", "acc_mutual_info", "accuracy", "exact_match", "em", "f1", "mcc",
                    "matthews_corrcoef", "bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum", "score",
                    "precision", "recall", "auc", "pass@1", "pass@10", "pass@100"})
SUFFIXES = {"max": True, "min": False}
STDERR = "_stderr"


def metric_name(metric: str) -> str:
    """The part of a key that says what was measured: METRIC of `harness/TASK/METRIC[,FILTER]`, else the last part
    (`loss` of `val/val/loss`)."""
    parts = metric.split("/")
    name = parts[2] if parts[0] == "harness" and len(parts) > 2 else parts[-1]
    return name.split(",")[0]


def known_direction(metric: str) -> bool | None:
    """True: higher is better; False: lower is better; None: the name does not say."""
    name = metric_name(metric)
    if name in LOWER or name.endswith(("_loss", "perplexity", "_ppl")):
        return False
    if name in HIGHER or name.startswith(("acc", "exact_match", "rouge", "pass@")) or name.endswith("_score"):
        return True
    return None


@dataclass(frozen=True)
class Ranking:
    """A metric and its direction: how checkpoints and sweep points are compared."""

    metric: str
    higher_is_better: bool

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def describe(self) -> str:
        return f"{self.metric} ({self.direction})"

    def order(self, value: Any) -> tuple[int, float]:
        """A sort key, best first: a value that is missing or not finite (a diverged run) comes after every finite one."""
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            return (1, 0.0)
        return (0, -float(value) if self.higher_is_better else float(value))

    def best(self, values: dict[int, float]) -> int | None:
        """The key (a step, a point) of the best finite value; a tie goes to the first (the earliest step)."""
        finite = [key for key in sorted(values) if self.order(values[key])[0] == 0]
        return min(finite, key=lambda key: self.order(values[key])) if finite else None


def ranking(spec: str, what: str) -> Ranking:
    """`spec` (METRIC, METRIC:max or METRIC:min) as a Ranking; ConfigError naming `what` (the key or flag that gave
    it) when it is empty, a stderr, or of a direction its name does not say."""
    text = str(spec).strip()
    metric, _, suffix = text.rpartition(":") if ":" in text else (text, "", "")
    if suffix and suffix not in SUFFIXES:
        raise ConfigError(f"{what}={text}: `:{suffix}` is no direction: end the metric with :max (higher is "
                          "better) or :min (lower is better), or leave the suffix out")
    if not metric or metric.startswith("/") or metric.endswith("/"):
        raise ConfigError(f"{what}={text!r} names no metric: give a key of the run's measurements, e.g. val/val/loss "
                          "or harness/TASK/acc")
    if metric.endswith(STDERR):
        raise ConfigError(f"{what}={text}: a standard error is no measure of quality: name the metric itself, "
                          f"{metric.removesuffix(STDERR)}")
    if suffix:
        return Ranking(metric, SUFFIXES[suffix])
    higher = known_direction(metric)
    if higher is None:
        raise ConfigError(f"{what}={text}: whether a higher or a lower {metric_name(metric)} is better is not known "
                          f"(losses, perplexities and error rates are lower-is-better, accuracies and scores "
                          f"higher-is-better): say it, {what}={metric}:max or {what}={metric}:min")
    return Ranking(metric, higher)
