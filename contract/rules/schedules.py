"""Learning-rate schedules as closed forms of the step (no torch: the launch plan computes the same rates on a login
node). Nothing else is state: a resumed run, or one extended with a larger trainer.max_steps, trains at the rate its
own config gives for the step.

`Schedule.factor(n)` multiplies the peak rate (optim.lr after optim.lr_scaling) for the optimizer step taken after
n steps: step k of metrics.jsonl (k = n + 1) trains at peak x factor(k - 1). In terms of k, with W warmup steps, T
= trainer.max_steps and m = optim.min_lr_ratio:

  warmup        every schedule: k / W up to step W, which trains at the peak
  linear        m + (1 - m) (1 - p), p = (k - W) / (T - W): step T trains at the floor
  constant      1 (m is not read)
  wsd           1 up to step D, then m + (1 - m) shape(q), q = (k - D) / (T - D), shape linear 1 - q, cosine
                (1 + cos(pi q)) / 2 or 1-sqrt 1 - sqrt(q) (MiniCPM; Hagele et al. 2024, whose 20% 1-sqrt cool-down
                matches cosine); step T trains at the floor. D is optim.decay_start_step, else T - round(optim.
                decay_fraction x T), the decay taking the last fraction of the run (torchtitan's decay_ratio,
                OLMo-core's decay_fraction)
  inverse_sqrt  max(m, sqrt(tau / (tau + k - W))): 1/sqrt(2) of the peak tau steps after warmup; tau is
                optim.timescale, else W, which makes it Megatron's, fairseq's and OLMo-core's sqrt(W / k)
  cosine        the schedule slurmtrain always had, bit for bit: (n + 1) / W while n < W, then m + (1 - m) (1 +
                cos(pi p)) / 2 with p = (n - W) / (T - W), so step W + 1 also trains at the peak and the floor is the
                rate after step T

A decay's progress is capped at 1: past T (never trained, but a schedule is defined everywhere) the rate is the floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SCHEDULES = ("cosine", "linear", "constant", "wsd", "inverse_sqrt")
DECAY_SHAPES = ("1-sqrt", "linear", "cosine")
# The keys each schedule reads beyond optim.warmup_steps; a key set for a schedule that ignores it is refused.
READS = {"min_lr_ratio": ("cosine", "linear", "wsd", "inverse_sqrt"), "decay_fraction": ("wsd",),
         "decay_shape": ("wsd",), "decay_start_step": ("wsd",), "timescale": ("inverse_sqrt",)}
# Schedules whose rate does not depend on trainer.max_steps: extending a run changes nothing in them.
LENGTH_FREE = ("constant", "inverse_sqrt")


def cosine_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Warmup then cosine decay: the schedule slurmtrain always had (and the default)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def decay_shape(shape: str, progress: float) -> float:
    """1 at progress 0, 0 at progress 1."""
    if shape == "linear":
        return 1 - progress
    if shape == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    if shape == "1-sqrt":
        return 1 - math.sqrt(progress)
    raise ValueError(f"optim.decay_shape={shape} is not one of {', '.join(DECAY_SHAPES)}")


@dataclass(frozen=True)
class Schedule:
    kind: str
    max_steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    decay_fraction: float = 0.2
    decay_shape: str = "1-sqrt"
    decay_start_step: int | None = None
    timescale: int | None = None

    @classmethod
    def from_config(cls, optim: Any, max_steps: int) -> Schedule:
        """From an optim section (a config.yaml written before schedules were configurable reads as cosine)."""
        def get(key: str, default: Any) -> Any:
            value = optim.get(key, default)
            return default if value is None else value

        start, timescale = optim.get("decay_start_step", None), optim.get("timescale", None)
        return cls(kind=str(get("schedule", "cosine")), max_steps=int(max_steps),
                   warmup_steps=int(get("warmup_steps", 0)), min_lr_ratio=float(get("min_lr_ratio", 0.0)),
                   decay_fraction=float(get("decay_fraction", 0.2)), decay_shape=str(get("decay_shape", "1-sqrt")),
                   decay_start_step=None if start is None else int(start),
                   timescale=None if timescale is None else int(timescale))

    @property
    def decay_start(self) -> int:
        """wsd: the last step at the peak; the decay runs over the steps after it, to the floor at max_steps."""
        if self.decay_start_step is not None:
            return self.decay_start_step
        return self.max_steps - round(self.decay_fraction * self.max_steps)

    @property
    def tau(self) -> int:
        """inverse_sqrt: steps after warmup at which the rate is 1/sqrt(2) of the peak."""
        return self.timescale if self.timescale is not None else self.warmup_steps

    def factor(self, n: int) -> float:
        """The multiple of the peak rate for the optimizer step taken after `n` steps (step n + 1)."""
        if self.kind == "cosine":
            return cosine_factor(n, self.warmup_steps, self.max_steps, self.min_lr_ratio)
        k, w, t, m = n + 1, self.warmup_steps, self.max_steps, self.min_lr_ratio
        if k <= w:
            return k / w
        if self.kind == "constant":
            return 1.0
        if self.kind == "linear":
            return m + (1 - m) * (1 - min(1.0, (k - w) / max(1, t - w)))
        if self.kind == "wsd":
            start = self.decay_start
            if k <= start or t <= start:
                return 1.0
            return m + (1 - m) * decay_shape(self.decay_shape, min(1.0, (k - start) / (t - start)))
        if self.kind == "inverse_sqrt":
            return max(m, math.sqrt(self.tau / (self.tau + k - w)))
        raise ValueError(f"optim.schedule={self.kind} is not one of {', '.join(SCHEDULES)}")

    def refusal(self) -> str | None:
        """Why this schedule can't run as configured (one line that names the fix), or None."""
        w, t = self.warmup_steps, self.max_steps
        if self.kind == "wsd" and self.decay_start_step is not None:
            if self.decay_start_step > t:
                return (f"optim.decay_start_step={self.decay_start_step} is past trainer.max_steps={t}: set "
                        f"optim.decay_start_step<={t} ({t} trains the stable phase only; raise trainer.max_steps "
                        "later to anneal)")
            if self.decay_start_step < w:
                return (f"optim.decay_start_step={self.decay_start_step} is inside the warmup "
                        f"(optim.warmup_steps={w}): set optim.decay_start_step>={w} or lower optim.warmup_steps")
        elif self.kind == "wsd" and self.decay_start < w:
            return (f"optim.warmup_steps={w} and the decay (optim.decay_fraction={self.decay_fraction:g} of "
                    f"trainer.max_steps={t} = {t - self.decay_start} steps) overlap in a run of {t} steps: lower "
                    "optim.warmup_steps or optim.decay_fraction, or raise trainer.max_steps")
        if self.kind == "inverse_sqrt" and self.tau == 0:
            return ("optim.schedule=inverse_sqrt without warmup needs a timescale: set optim.timescale=N (the rate "
                    "is the peak x sqrt(N / (N + k)) k steps after warmup)")
        return None

    def describe(self, peak: float) -> str:
        """The plan's words for the whole schedule, e.g. `wsd: warmup 5 steps, stable to step 80, 1-sqrt decay to
        0.0003 at step 100`."""
        w, t = self.warmup_steps, self.max_steps
        parts = [] if w == 0 else [f"warmup {w} steps" + (" (the whole run: the rate only ramps up)" if w >= t
                                                          and self.kind != "wsd" else "")]
        floor = f"{peak * self.min_lr_ratio:.4g}"
        if self.kind == "linear":
            parts.append(f"linear decay to {floor} at step {t}")
        elif self.kind == "cosine":
            # Cosine reaches its floor one step after the last: the last step trains just above it.
            parts.append(f"cosine decay toward {floor}, step {t} trains at {peak * self.factor(t - 1):.4g}")
        elif self.kind == "constant":
            parts.append(f"constant {peak:.4g}")
        elif self.kind == "wsd":
            start = self.decay_start
            if start >= t:
                parts.append(f"stable to step {t} (no decay in this run: raise trainer.max_steps later to anneal "
                             f"from step {start})")
            else:
                parts.append(f"stable to step {start}, {self.decay_shape} decay to {floor} at step {t}")
        elif self.kind == "inverse_sqrt":
            parts.append(f"inverse square root with timescale {self.tau} steps (floor {floor}), "
                         f"{peak * self.factor(t - 1):.4g} at step {t}")
        return f"{self.kind} schedule: " + ", ".join(parts)
