"""The scalars a metrics row gives the dashboards: wandb (train/observe/metrics.py) and TensorBoard
(train/observe/tensorboard_log.py) log the same values."""

from __future__ import annotations

from typing import Any

# Telemetry's per-node figure before the metrics row puts it on its own clock: each node's share of the interval's
# tokens (train/observe/telemetry.py interval_fields -> MetricsLogger.log's tokens_per_s_by_node).
NODE_SHARES = "_node_token_shares"


def wandb_values(row: dict[str, Any]) -> dict[str, Any]:
    """Scalars as they are, per-node throughput as one series per host, a mixture's tokens and epoch as one series
    per source, the straggler count; the per-rank lists stay in metrics.jsonl (thousands of series would drown the
    dashboard)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key == "time":
            continue  # wandb stamps every row itself (_timestamp)
        if isinstance(value, int | float):
            out[key] = value
        elif key in ("tokens_per_s_by_node", "tokens_by_source", "epoch_by_source"):
            out.update({f"{key}/{name}": v for name, v in value.items()})
        elif key == "stragglers":
            out["stragglers"] = len(value)
    return out
