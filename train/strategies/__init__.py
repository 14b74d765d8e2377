"""One Strategy protocol, one module per backend. Nothing outside this package branches on a strategy's name."""

from __future__ import annotations

from typing import Any

from train.strategies.base import Strategy


def build_strategy(cfg: Any, env: Any, device: Any) -> Strategy:
    name = cfg.strategy.name
    if name == "single":
        from train.strategies.single import SingleStrategy

        return SingleStrategy(cfg, env, device)
    if name == "ddp":
        from train.strategies.ddp import DDPStrategy

        return DDPStrategy(cfg, env, device)
    raise ValueError(f"unknown strategy {name!r}")


__all__ = ["Strategy", "build_strategy"]
