"""Where the benchmarks are and where their results go: the names `python -m bench` runs (bench/__main__.py) and the
report reads back (bench/report.py), each a module with run(quick) -> result and report(result)."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BENCHMARKS = {
    "checkpoint_stall": "bench.checkpoint_stall",
    "submit_latency": "bench.submit_latency",
    "memory_estimate": "bench.memory_estimate",
    "telemetry_overhead": "bench.telemetry_overhead",
    "loop_overhead": "bench.loop_overhead",
    "preemption_turnaround": "bench.preemption_turnaround",
    "prepare_throughput": "bench.prepare_throughput",
    "data_scale": "bench.data_scale",
    "validation_cost": "bench.validation_cost",
    "stability_overhead": "bench.stability_overhead",
    "replica_check": "bench.replica_check",
    "sweep_planning": "bench.sweep_planning",
    "sample_cache": "bench.sample_cache",
    "container_start": "bench.container_start",
    "grad_compression": "bench.grad_compression",
    "loss_cost": "bench.loss_cost",
    "failure_cost": "bench.failure_cost",
}
