"""Which dashboards a run logs to besides metrics.jsonl: logger.backend, one name or a list of them.

    logger.backend=wandb                   the default (logger.mode offline: RUN_DIR/wandb/)
    logger.backend=tensorboard             event files in RUN_DIR/tensorboard/ (`tensorboard --logdir RUN_ROOT`)
    logger.backend=[wandb,tensorboard]     both
    logger.backend=none                    neither

Torch-free: the launcher checks the value at launch, the ranks read the same answer.
"""

from __future__ import annotations

import difflib
from typing import Any

from contract.errors import ConfigError

BACKENDS = ("wandb", "tensorboard")
NONE = "none"
# The keys only wandb reads, with their defaults (contract/config/operations.py LoggerConfig); logger.group is
# left out: a sweep sets it for every run, whichever dashboards it logs to.
WANDB_KEYS = {"mode": "offline", "project": "slurmtrain", "entity": None}


def backends(value: Any) -> tuple[str, ...]:
    """The dashboards logger.backend names, in the order given ("none": none); ConfigError in one line for anything
    else (an unknown name, a name twice, none beside another, a list of lists)."""
    names = [value] if isinstance(value, str) else list(value) if _is_sequence(value) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"logger.backend={value} is not a dashboard name nor a list of them: set logger.backend="
                          "wandb, tensorboard, none or [wandb,tensorboard]")
    for name in names:
        if name not in (*BACKENDS, NONE):
            meant = difflib.get_close_matches(name, [*BACKENDS, NONE], n=1) or ["tensorboard"]
            raise ConfigError(f"logger.backend={_shown(value)}: {name} is not one of {', '.join(BACKENDS)}, {NONE}: "
                              f"set logger.backend={meant[0]}")
    if len(set(names)) < len(names):
        raise ConfigError(f"logger.backend={_shown(value)} names a backend twice: name each once, e.g. "
                          "logger.backend=[wandb,tensorboard]")
    if NONE in names and len(names) > 1:
        raise ConfigError(f"logger.backend={_shown(value)} mixes none with a backend: set logger.backend=none for "
                          "metrics.jsonl alone, or name only the backends")
    return tuple(n for n in names if n != NONE)


def check_logger(logger: Any) -> tuple[str, ...]:
    """backends(logger.backend), and a wandb key set to something other than its default refused when wandb is not
    one of them (it would do nothing)."""
    chosen = backends(logger.get("backend"))
    if "wandb" not in chosen:
        for key, default in WANDB_KEYS.items():
            if logger.get(key) != default:
                raise ConfigError(f"logger.{key}={logger.get(key)} has no effect with logger.backend="
                                  f"{_shown(logger.get('backend'))} (only wandb reads it): drop it, or add wandb: "
                                  f"logger.backend=[wandb{''.join(f',{b}' for b in chosen)}]")
    return chosen


def _is_sequence(value: Any) -> bool:
    return hasattr(value, "__iter__") and hasattr(value, "__len__") and not isinstance(value, str | bytes | dict) \
        and not hasattr(value, "keys")


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else "[" + ",".join(map(str, value)) + "]"
