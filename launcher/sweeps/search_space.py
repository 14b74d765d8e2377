"""A search's parameters from Hydra's sweep syntax, as hydra-optuna-sweeper reads it:

    optim.lr=tag(log,interval(1e-5,1e-1))   a float, log-uniform      (interval(a,b): uniform)
    optim.warmup_steps=choice(50,200,800)   one of these values
    trainer.seed=range(1,4)                 an int from start to stop (exclusive), by step

Every other override is fixed: each trial has it. Pure: no Optuna here (distributions are plain dicts,
contract/search/optuna_objects.py builds Optuna's)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from contract.errors import ConfigError


@dataclass
class Space:
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)
    # Values of each parameter that every trial's config must accept: its ends, or every choice.
    corners: dict[str, list[Any]] = field(default_factory=dict)

    def grid_size(self) -> int | None:
        """Combinations for search.sampler=grid; None: a parameter is continuous."""
        if any(p["type"] != "categorical" for p in self.params.values()):
            return None
        return math.prod(len(p["choices"]) for p in self.params.values())


# A trial's length: the same for every trial of a search (its rungs, steps and GPU-hours are counted in it).
LENGTH_KEYS = ("trainer.max_steps", "trainer.max_tokens", "trainer.max_epochs")


def parse(arguments: list[str]) -> Space:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(arguments)
    except HydraException as err:
        raise ConfigError(f"{' '.join(str(err).split())}: check the override's syntax") from None
    space = Space()
    for o in parsed:
        if not o.is_sweep_override():
            space.fixed.append(str(o.input_line))
            continue
        key, typed = o.get_key_element().lstrip("+~"), str(o.input_line)
        if "." not in key or o.package is not None:
            raise ConfigError(f"{typed}: a search samples values of keys (optim.lr=...), not config groups: "
                              f"choose the group with a fixed {key}=NAME, or run one search per group option")
        value = o.value()
        tags = set(getattr(value, "tags", None) or ())
        unread = tags - ({"log"} if isinstance(value, IntervalSweep) else set())
        if unread:
            raise ConfigError(f"{typed}: a search reads one tag, log, on an interval (tag(log,interval(LOW,HIGH)): "
                              f"log-uniform), not {', '.join(sorted(unread))}: fix or drop it")
        if isinstance(value, IntervalSweep):
            low, high, log = value.start, value.end, "log" in value.tags
            if not (low is not None and high is not None and low < high):
                raise ConfigError(f"{typed}: an empty interval: give interval(LOW,HIGH) with LOW < HIGH")
            if log and low <= 0:
                raise ConfigError(f"{typed}: a log interval needs LOW > 0 (log-uniform values are positive)")
            is_int = isinstance(low, int) and isinstance(high, int) and not isinstance(low, bool)
            space.params[key] = {"type": "int" if is_int else "float", "low": low, "high": high, "log": log}
            space.corners[key] = [low, high]
        elif isinstance(value, RangeSweep):
            values = list(o.sweep_iterator())
            if not values:
                raise ConfigError(f"{typed}: an empty range: give range(START,STOP[,STEP]) with START < STOP")
            if all(isinstance(v, int) for v in values):
                step = int(value.step or 1)
                space.params[key] = {"type": "int", "low": values[0], "high": values[-1], "step": step, "log": False}
            else:
                space.params[key] = {"type": "categorical", "choices": values}
            space.corners[key] = [values[0], values[-1]]
        elif isinstance(value, ChoiceSweep):
            values = list(o.sweep_iterator())
            if not values:
                raise ConfigError(f"{typed}: an empty choice: give choice(A,B,...) at least one value")
            space.params[key] = {"type": "categorical", "choices": values}
            space.corners[key] = values
        else:
            raise ConfigError(f"{typed}: a search takes interval(), tag(log,interval()), choice() or range()")
    for key in space.params:
        if key in LENGTH_KEYS:
            raise ConfigError(f"{key} is what every trial's length is measured by (the pruner's rungs, the budget): "
                              f"give it one value, and search other keys")
        again = [f for f in space.fixed if f.split("=", 1)[0].lstrip("+~") == key]
        if again:
            raise ConfigError(f"{key} is searched and also given as {again[0]}: drop one of them")
    if not space.params:
        raise ConfigError("hydra/sweeper=search needs a parameter to search, e.g. 'optim.lr=tag(log,interval(1e-5,1e-1))' "
                          "or 'optim.warmup_steps=choice(50,200)'")
    return space


def grid_values(space: Space) -> dict[str, list[Any]]:
    """search.sampler=grid's values: every parameter must be a choice() or an int range()."""
    out = {}
    for key, p in space.params.items():
        if p["type"] == "categorical":
            out[key] = list(p["choices"])
        elif p["type"] == "int":
            out[key] = list(range(int(p["low"]), int(p["high"]) + 1, int(p.get("step") or 1)))
        else:
            raise ConfigError(f"search.sampler=grid: {key} is continuous (interval): give it as choice(...) values, "
                              "or use search.sampler=tpe")
    return out


def override(key: str, value: Any) -> str:
    """The override that sets one trial's value, as the command would type it."""
    return f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"


def describe_space(params: dict[str, dict[str, Any]]) -> str:
    """What each trial draws: `optim.lr log-uniform 0.0001 to 0.1, optim.warmup_steps one of 50, 200`."""
    parts = []
    for key, p in params.items():
        if p["type"] == "categorical":
            parts.append(f"{key} one of {', '.join(map(str, p['choices']))}")
        else:
            kind = "log-uniform" if p.get("log") else ("integers" if p["type"] == "int" else "uniform")
            step = f" step {p['step']}" if p["type"] == "int" and int(p.get("step") or 1) != 1 else ""
            parts.append(f"{key} {kind} {p['low']:g} to {p['high']:g}{step}")
    return ", ".join(parts)
