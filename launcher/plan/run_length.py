"""How long a run trains, in optimizer steps: trainer.max_steps as typed, or the first step that reaches a token or
epoch budget (trainer.max_tokens, trainer.max_epochs). The plan writes the step into trainer.max_steps, which
everything after it reads (the schedule, the loop, evaluation jobs, status, a sweep's summary), and says how it
was had.

A step trains the global batch of samples, data.seq_len input tokens each: tokens after step n = n x batch x seq_len,
so max_tokens=N ends at ceil(N / (batch x seq_len)). An epoch of data.path is its samples (windows of seq_len + 1
tokens, contract/data/spec.py); of a mixture's source, that source's samples, read at its weight
(contract/data/mixture.py apportions them): the run ends at the first step by which the source gave them all. An
epoch of a user's dataset (data._target_) is its len() samples, which the plan's probe reads (launcher/plan/probe.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, open_dict

from contract.errors import ConfigError, shown

# The length of a run that types no budget.
DEFAULT_MAX_STEPS = 100
BUDGETS = ("max_tokens", "max_epochs")


@dataclass(frozen=True)
class RunLength:
    steps: int
    line: str = ""  # the plan's line for a converted budget


def settle_length(cfg: DictConfig, global_batch: int, seq_len: int, world: int) -> RunLength:
    """The run's length, written into cfg.trainer.max_steps; ConfigError (one line) for budgets that contradict
    each other or can't be counted. `world`: the ranks a user's dataset was probed for (its size)."""
    t = cfg.trainer
    typed = [k for k in BUDGETS if t.get(k) is not None]
    if len(typed) > 1:
        raise ConfigError(f"trainer.max_tokens={shown(t.max_tokens)} and trainer.max_epochs={shown(t.max_epochs)} "
                          "are both set: keep one budget (drop the other)")
    if t.get("epochs_of") is not None and t.get("max_epochs") is None:
        raise ConfigError(f"trainer.epochs_of={t.epochs_of} has no effect without trainer.max_epochs: drop it, or set "
                          "trainer.max_epochs=N (passes over that source)")
    if typed and t.get("max_steps") is not None:
        key = typed[0]
        kind = {"max_tokens": "token", "max_epochs": "epoch"}[key]
        raise ConfigError(f"trainer.max_steps={t.max_steps} and trainer.{key}={shown(t[key])} are both set: the "
                          f"{kind} budget is converted to steps by the plan: drop trainer.max_steps")
    if "max_tokens" in typed:
        length = _tokens(t.max_tokens, global_batch * seq_len)
    elif "max_epochs" in typed:
        length = _epochs(cfg, float(t.max_epochs), global_batch, seq_len, world)
    else:
        length = RunLength(DEFAULT_MAX_STEPS if t.get("max_steps") is None else int(t.max_steps))
    with open_dict(cfg):
        cfg.trainer.max_steps = length.steps
    return length


def _tokens(budget: float, per_step: int) -> RunLength:
    if not float(budget).is_integer():
        raise ConfigError(f"trainer.max_tokens={budget:g} is not a whole number of tokens: set trainer.max_tokens="
                          f"{math.ceil(budget)}")
    budget = int(budget)
    steps = -(-budget // per_step)
    return RunLength(steps, f"length: trainer.max_tokens={budget:,} = {steps} steps of {per_step:,} tokens "
                            f"({steps * per_step:,} tokens: step {steps} is the first to reach it)")


def _epochs(cfg: DictConfig, epochs: float, global_batch: int, seq_len: int, world: int) -> RunLength:
    d, named = cfg.data, cfg.trainer.get("epochs_of")
    if named is not None and not d.get("sources"):
        where = f"data._target_={d._target_}" if d.get("_target_") else "data.path"
        raise ConfigError(f"trainer.epochs_of={named} names a source of a mixture, and {where} is the one source: drop "
                          "trainer.epochs_of")
    if d.get("_target_"):
        return _dataset_epochs(cfg, epochs, global_batch, world)
    if d.name != "tokens":
        raise ConfigError(f"trainer.max_epochs counts passes over the data's samples, and data={d.name} is an endless "
                          "stream: set trainer.max_tokens or trainer.max_steps")
    from contract.data.spec import token_sources

    specs = token_sources(d)
    names = [s.name for s in specs]
    if not d.get("sources"):
        samples = _needed(epochs, specs[0].windows(seq_len))
        steps = -(-samples // global_batch)
        return RunLength(steps, f"length: trainer.max_epochs={epochs:g} of data.path ({specs[0].windows(seq_len):,} "
                                f"samples) = {steps} steps of {global_batch:,} samples ({steps * global_batch:,} "
                                f"samples, {steps * global_batch / specs[0].windows(seq_len):.4g} epochs)")
    if named is None:
        raise ConfigError(f"trainer.max_epochs={epochs:g} with a mixture counts passes over one source: add "
                          f"trainer.epochs_of=NAME (one of {', '.join(names)})")
    if named not in names:
        raise ConfigError(f"trainer.epochs_of={named} is not a source of data.sources: set trainer.epochs_of= one of "
                          f"{', '.join(names)}")
    index = names.index(named)
    spec = specs[index]
    if spec.weight == 0:
        raise ConfigError(f"trainer.epochs_of={named}: data.sources.{named}.weight is 0, so the run never reads it: "
                          "give it a weight, or count the epochs of another source")
    windows = spec.windows(seq_len)
    steps = _steps_for(_needed(epochs, windows), [s.weight for s in specs], index, global_batch)
    from contract.data.mixture import samples_per_source

    gives = samples_per_source([s.weight for s in specs], steps * global_batch)[index]
    return RunLength(steps, f"length: trainer.max_epochs={epochs:g} of data.sources.{named} ({windows:,} samples, "
                            f"weight {spec.weight:.3g}) = {steps} steps of {global_batch:,} samples "
                            f"({steps * global_batch:,} samples, {gives:,} of them {named}: {gives / windows:.4g} "
                            "epochs)")


def _dataset_epochs(cfg: DictConfig, epochs: float, global_batch: int, world: int) -> RunLength:
    """A user's dataset (data._target_): an epoch is its len() samples, which the plan's probe read (sample i of
    the stream is item i mod len, train/data/dataset.py)."""
    from launcher.plan.probe import probe

    target = cfg.data._target_
    if cfg.launcher.force:
        raise ConfigError(f"trainer.max_epochs needs the size of data._target_={target}, and launcher.force=true "
                          "skips reading it at launch: drop launcher.force, or set trainer.max_tokens or "
                          "trainer.max_steps")
    answer = probe(cfg, world)
    if answer.data_samples is None:
        raise ConfigError(f"trainer.max_epochs needs the size of data._target_={target}, and the launch could not "
                          f"read it ({answer.note or 'the model probe failed'}): set trainer.max_tokens or "
                          "trainer.max_steps")
    size = int(answer.data_samples)
    steps = -(-_needed(epochs, size) // global_batch)
    return RunLength(steps, f"length: trainer.max_epochs={epochs:g} of data._target_={target} ({size:,} samples) = "
                            f"{steps} steps of {global_batch:,} samples ({steps * global_batch:,} samples, "
                            f"{steps * global_batch / size:.4g} epochs)")


def _needed(epochs: float, windows: int) -> int:
    """Samples in `epochs` passes over `windows` (at least one; a float product's last bit is no extra sample)."""
    return max(1, math.ceil(round(epochs * windows, 6)))


def _steps_for(samples: int, weights: list[float], index: int, global_batch: int) -> int:
    """The first step by which source `index` gave `samples` samples: what it gave grows with the step, so a
    doubling then a bisection."""
    from contract.data.mixture import samples_per_source

    def gives(steps: int) -> int:
        return samples_per_source(weights, steps * global_batch)[index]

    high = max(1, -(-samples // global_batch))
    while gives(high) < samples:
        high *= 2
    low = high // 2  # gives(low) < samples, or low is 0
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if gives(mid) < samples else (low, mid)
    return high


def length_text(cfg: Any) -> str:
    """How the run's length was given, for a line about it: `trainer.max_tokens=N (step S)` or
    `trainer.max_steps=S`."""
    t = cfg.trainer
    for key in BUDGETS:
        if t.get(key) is not None:
            return f"trainer.{key}={shown(t[key])} (step {t.max_steps})"
    return f"trainer.max_steps={t.max_steps}"


def length_key(cfg: Any) -> str:
    """The key that sets the run's length: the one to raise to train on."""
    t = cfg.trainer
    return next((f"trainer.{key}" for key in BUDGETS if t.get(key) is not None), "trainer.max_steps")


