"""What planning a sweep costs per point, as a ratio measured in one run.

`python -m launcher -m trainer.seed=range(0,N) +cluster=local_slurm launcher.dry_run=true` composes, checks and plans
every point and submits nothing (a dry run: no cluster needed), against a single dry run of the same config. Each
command runs in a fresh directory (run.root is the default, relative `outputs`), and is measured on the child's CPU
time (resource.getrusage), not the wall clock: the cores are shared, and waiting for them is not planning. Medians
of several repetitions.

The figure is the N-point dry run against the single one; what one more point costs, (N-point - single) / N, is its
detail and its target: under 15 ms of CPU (issue 27: 38 ms a point after the training side grew, against 16.6 s for
1000 points before, on the issue's machine).
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
from typing import Any

POINTS, QUICK_POINTS = 1000, 100
REPEATS = 3
TARGET_MS = 15.0
COMMON = ["+cluster=local_slurm", "launcher.dry_run=true"]


def _cpu_seconds(cmd: list[str]) -> float:
    """CPU seconds (user + system) of `cmd` and the processes it waited for, run in a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="bench sweep ") as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=1200)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr[-1000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(quick: bool = False) -> dict[str, Any]:
    points = QUICK_POINTS if quick else POINTS
    cases = {"single": [sys.executable, "-m", "launcher", *COMMON],
             "sweep": [sys.executable, "-m", "launcher", "-m", f"trainer.seed=range(0,{points})", *COMMON]}
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(1 if quick else REPEATS):
        for name, cmd in cases.items():  # interleaved: a change in the machine's load touches both alike
            seconds[name].append(_cpu_seconds(cmd))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    per_point_ms = (median["sweep"] - median["single"]) / points * 1000
    return {
        "benchmark": "sweep_planning",
        "quick": quick,
        "points": points,
        "repeats": len(seconds["single"]),
        "cpu_seconds": seconds,
        "median_cpu_s": median,
        "sweep_vs_single": median["sweep"] / median["single"],
        "per_point_ms": per_point_ms,
        "target_ms": TARGET_MS,
        "target_met": per_point_ms < TARGET_MS,
        "command": "python -m bench sweep_planning",
    }


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    m = r["median_cpu_s"]
    return [{"figure": f"{r['points']}-point sweep dry run (planning every point)", "value": r["sweep_vs_single"],
             "baseline": "a single dry run", "target": f"a point under {r['target_ms']:g} ms CPU",
             "met": r["target_met"],
             "detail": f"{r['per_point_ms']:.1f} ms CPU a point; {m['sweep']:.2f} s against {m['single']:.2f} s CPU"}]


def report(r: dict[str, Any]) -> str:
    m = r["median_cpu_s"]
    verdict = "met" if r["target_met"] else "MISSED"
    return (f"sweep planning (median of {r['repeats']}, CPU time): a {r['points']}-point dry run {m['sweep']:.2f} s "
            f"against a single dry run {m['single']:.2f} s = {r['sweep_vs_single']:.2f}x; {r['per_point_ms']:.1f} ms "
            f"a point (target under {r['target_ms']:g} ms: {verdict})")


if __name__ == "__main__":
    print(report(run(quick="--quick" in sys.argv)))
