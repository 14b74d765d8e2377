"""How long the user waits for a submission, on the local SLURM cluster, as ratios measured in one run.

Each command is timed from start to exit (it exits once the job id is printed: nothing waits for the job), the
median of several repetitions, and everything it submitted is cancelled at once:
  - baseline: `python -c "import torch"` (what any torch-importing launcher pays before doing anything);
  - a single run: `python -m launcher +cluster=local_slurm ...`;
  - a 4-point sweep (2 x 2) and a 64-point sweep (8 x 8), each submitted as one job array.
Targets: a single submission at most 0.25x the torch import; a 64-point sweep at most 3x a single submission.

Where a single submission's time goes is measured in the same run by commands that each stop at one stage
(medians too): the interpreter alone, the imports (Hydra, OmegaConf, submitit, ours), the imports plus one
composition of the config, and a bare `sbatch --hold` round trip; the rest is planning, checks, the run directory
and submitit's files. These are the `breakdown_s` fields and the detail of the report's first row.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPEATS = 3
SINGLE_TARGET = 0.25
SWEEP64_TARGET = 3.0
COMMON = ["+cluster=local_slurm", "trainer.max_steps=50", "logger.backend=none"]


def _timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)
    elapsed = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr[-1000:]}")
    return elapsed, out.stdout


def _cancel(stdout: str) -> None:
    ids = re.findall(r"submitted (?:job|array) (\d+)", stdout)
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


def run(quick: bool = False) -> dict[str, Any]:
    if shutil.which("sbatch") is None or subprocess.run(["scontrol", "ping"], capture_output=True).returncode:
        return {"skipped": "no local SLURM cluster (make slurm-up)", "target_met": True}
    cases = {
        "torch_import": lambda i: [sys.executable, "-c", "import torch"],
        "single": lambda i: [sys.executable, "-m", "launcher", *COMMON, f"run.name=single{i}"],
        # New points in every repetition: a point whose run directory exists is a resume, checked against the
        # config saved there (re-submitting a sweep), which is not what a first submission costs.
        "sweep4": lambda i: [sys.executable, "-m", "launcher", "-m", "optim.lr=1e-3,3e-3",
                             f"trainer.seed={2 * i + 1},{2 * i + 2}", *COMMON, f"launcher.sweep_name=s4_{i}"],
        "sweep64": lambda i: [sys.executable, "-m", "launcher", "-m", f"optim.lr=range({8 * i + 1},{8 * i + 9})",
                              "trainer.seed=range(1,9)", *COMMON, f"launcher.sweep_name=s64_{i}"],
    }
    compose = ("from launcher.__main__ import main; import submitit; from launcher.compose import compose_config; "
               "compose_config(['+cluster=local_slurm'])")
    stages = {
        "interpreter": lambda i: [sys.executable, "-c", "pass"],
        "imports": lambda i: [sys.executable, "-c", "from launcher.__main__ import main; import submitit"],
        "imports_and_compose": lambda i: [sys.executable, "-c", compose],
        "sbatch": lambda i: ["sbatch", "--hold", "--parsable", "--job-name=bench-sbatch", "--output=/dev/null",
                             "--wrap", "true"],
    }
    cases.update(stages)
    times: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="bench submit ") as tmp:
        root = Path(tmp)
        for i in range(1 if quick else REPEATS):
            for name, make in cases.items():
                cmd = make(i)
                if name not in ("torch_import", *stages):
                    cmd.append(f"run.root={root / name}")
                elapsed, stdout = _timed(cmd, root)
                _cancel(stdout)
                if name == "sbatch":
                    subprocess.run(["scancel", stdout.strip().split(";")[0]], capture_output=True, timeout=60)
                times[name].append(elapsed)
    median = {name: statistics.median(values) for name, values in times.items()}
    single_ratio = median["single"] / median["torch_import"]
    sweep_ratio = median["sweep64"] / median["single"]
    breakdown = {"interpreter": median["interpreter"],
                 "imports": median["imports"] - median["interpreter"],
                 "compose": median["imports_and_compose"] - median["imports"],
                 "sbatch": median["sbatch"]}
    breakdown["plan_checks_rundir_submitit"] = median["single"] - sum(breakdown.values())
    return {
        "repeats": len(times["single"]),
        "breakdown_s": breakdown,
        "quick": quick,
        "seconds": times,
        "median_s": median,
        "single_vs_torch_import": single_ratio,
        "sweep4_vs_single": median["sweep4"] / median["single"],
        "sweep64_vs_single": sweep_ratio,
        "targets": {"single_vs_torch_import": SINGLE_TARGET, "sweep64_vs_single": SWEEP64_TARGET},
        "target_met": single_ratio <= SINGLE_TARGET and sweep_ratio <= SWEEP64_TARGET,
        "command": "python -m bench submit_latency",
    }


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    m = r["median_s"]
    return [{"figure": "single submission to job id", "value": r["single_vs_torch_import"],
             "baseline": 'python -c "import torch"', "target": f"<= {SINGLE_TARGET}",
             "met": r["single_vs_torch_import"] <= SINGLE_TARGET,
             "detail": f"{m['single']:.2f} s vs {m['torch_import']:.2f} s" + _where(r)},
            {"figure": "64-point sweep as one array", "value": r["sweep64_vs_single"],
             "baseline": "a single submission", "target": f"<= {SWEEP64_TARGET}",
             "met": r["sweep64_vs_single"] <= SWEEP64_TARGET, "detail": f"{m['sweep64']:.2f} s"},
            {"figure": "4-point sweep as one array", "value": r["sweep4_vs_single"],
             "baseline": "a single submission", "target": None, "met": None, "detail": f"{m['sweep4']:.2f} s"}]


def _where(r: dict[str, Any]) -> str:
    """'; where: interpreter 0.05 s, imports 0.30 s, ...' (results stored before the breakdown: '')."""
    if "breakdown_s" not in r:
        return ""
    return "; where: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in r["breakdown_s"].items())


def report(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"submit latency: skipped ({result['skipped']})"
    m = result["median_s"]
    return (f"submit latency (median of {result['repeats']}): import torch {m['torch_import']:.2f} s, single "
            f"submission {m['single']:.2f} s = {result['single_vs_torch_import']:.2f}x (target <= {SINGLE_TARGET}x), "
            f"4-point sweep {m['sweep4']:.2f} s = {result['sweep4_vs_single']:.2f}x a single one, 64-point sweep "
            f"{m['sweep64']:.2f} s = {result['sweep64_vs_single']:.2f}x (target <= {SWEEP64_TARGET}x)" + _where(result))


def notes(r: dict[str, Any]) -> str:
    """REPORT.md's section: where a submission's time goes, and what limits it."""
    if "breakdown_s" not in r:
        return ""
    b, m = r["breakdown_s"], r["median_s"]
    lines = [f"Where a single submission's {m['single']:.2f} s go (medians, each stage measured by a command that "
             "stops there):", "", "| stage | seconds | share |", "| --- | --- | --- |"]
    lines += [f"| {k.replace('_', ' ')} | {v:.2f} | {v / m['single']:.0%} |" for k, v in b.items()]
    target_s = SINGLE_TARGET * m["torch_import"]
    largest = sorted(b, key=b.get, reverse=True)[:2]  # type: ignore[arg-type]
    lines += ["", f"The target ({SINGLE_TARGET}x an `import torch` of {m['torch_import']:.2f} s) is {target_s:.2f} s. "
              f"The largest stages are {largest[0].replace('_', ' ')} and {largest[1].replace('_', ' ')}. The "
              "imports (Hydra, OmegaConf, submitit) are paid before anything of ours runs, and composing is "
              "Hydra's (once per command: it composed twice before, see launcher/__main__.py); what is ours is "
              "the last stage. A sweep adds, per point, one config copy, the plan and its checks, and the "
              "point's run directory (config.yaml)."]
    return "\n".join(lines)
