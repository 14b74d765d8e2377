"""The overrides the user typed for the config being checked, so that a refusal quotes what was typed.

Whoever composes a config sets them around its checks (`python -m launcher`: Hydra's task overrides; a sweep: each
point's own). Configs composed elsewhere (tests, benchmarks) have none, and the checks fall back to key names.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from contract.errors import shown

_typed: tuple[str, ...] = ()


@contextmanager
def typed_as(overrides: Sequence[str]) -> Iterator[None]:
    global _typed
    before, _typed = _typed, tuple(str(o) for o in overrides)
    try:
        yield
    finally:
        _typed = before


def override_key(override: str) -> str:
    """`+trainer.foo=1` -> trainer.foo; `~model` -> model."""
    return override.split("=", 1)[0].lstrip("+~")


def typed_for(key: str) -> str | None:
    """The typed override that set `key`, a key below it (`+eval.every=10` for eval) or its section; None when the
    key came from a YAML file."""
    for override in _typed:
        name = override_key(override)
        if name == key or name.startswith(f"{key}."):
            return override
    for override in _typed:
        name = override_key(override)
        if key.startswith(f"{name}.") and "=" in override and not override.split("=", 1)[1].isidentifier():
            return override  # a whole section given as a value: +trainer={...}
    return None


def typed_exactly(key: str) -> str | None:
    """The typed override of `key` itself (`model=gpt2_124m` for model; not `model.d_model=32`); None if none."""
    return next((o for o in _typed if override_key(o) == key and "=" in o), None)


def as_typed(key: str, value: object) -> str:
    """`key=VALUE` for an error line: the value as the user typed it when an override set the key itself
    (`optim.lr=-1e-3`, not the -0.001 the config holds), else as contract.errors.shown writes it."""
    typed_text = typed_exactly(key)
    raw = None if typed_text is None else typed_text.split("=", 1)[1]
    if raw is not None and not set(raw) & set("${}[]"):  # an interpolation or a list: what it resolved to says more
        return f"{key}={raw}"
    return f"{key}={shown(value)}"


def typed() -> tuple[str, ...]:
    """Every override typed for the config being checked."""
    return _typed
