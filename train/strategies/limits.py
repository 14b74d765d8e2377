"""What a strategy cannot train, read off the model before it is wrapped: 0-dim parameters, mixed parameter dtypes,
parameters the forward leaves unused. Each strategy class says which of these it refuses (`Strategy.refusal`); the
launch probe asks on the meta device (exit 2 before anything runs) and the ranks ask again before wrapping.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

SHOWN = 3  # names quoted in a refusal; the rest counted


def named(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def scalar_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """0-dim parameters (tied ones once), by name."""
    return [(name, p) for name, p in model.named_parameters() if p.dim() == 0]


def mixed_dtypes(params: Iterable[tuple[str, nn.Parameter]]) -> tuple[str, str] | None:
    """Two trainable parameters of different dtypes (name (dtype), name (dtype)), or None when they agree."""
    first: dict[str, str] = {}
    for name, p in params:
        if p.requires_grad and p.is_floating_point():
            first.setdefault(str(p.dtype).removeprefix("torch."), name)
    if len(first) < 2:
        return None
    (a, a_name), (b, b_name) = list(first.items())[:2]
    return f"{a_name} ({a})", f"{b_name} ({b})"


def scalar_refusal(strategy: str, model: nn.Module, handled_by: str) -> str | None:
    scalars = [name for name, _ in scalar_parameters(model)]
    if not scalars:
        return None
    return (f"strategy={strategy} can't train 0-dim parameters ({named(scalars)}): make each a 1-element tensor "
            f"(nn.Parameter(torch.tensor([1.0])), not torch.tensor(1.0)), or use {handled_by}, which train them as "
            "they are")


def dtype_refusal(strategy: str, what: str, params: Iterable[tuple[str, nn.Parameter]], fallback: str) -> str | None:
    mixed = mixed_dtypes(params)
    if mixed is None:
        return None
    return (f"strategy={strategy} needs the trainable parameters of {what} in one dtype, and {mixed[0]} differs from "
            f"{mixed[1]}: cast the model to one dtype at the end of its constructor (for example model.float(); "
            f"precision= sets the compute dtype), or use {fallback}")


def unused_refusal(strategy: str, unused: list[str]) -> str | None:
    if not unused:
        return None
    return (f"strategy={strategy} needs a gradient for every trainable parameter in every step, and the model's "
            f"forward does not use {named(unused)}: remove them or freeze them (requires_grad_(False)), or use "
            "strategy=fsdp")
