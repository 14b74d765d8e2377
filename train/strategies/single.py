from __future__ import annotations

from train.strategies.base import Strategy


class SingleStrategy(Strategy):
    """One process, the bare model."""
