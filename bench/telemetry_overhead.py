"""What the training telemetry costs: median step time with `telemetry.enabled=true` against `false`, in one run.

Two ranks (gloo, DDP, one thread each) run the real training loop (train.loop.train) on a small GPT-2-like model,
alternating telemetry on and off in adjacent pairs (on/off, off/on, ...: a drift of the machine's speed cancels
out), in one process group. The step time of a run is the median over its log intervals of the interval's wall
time per step as metrics.jsonl's `tokens_per_s` states it (rank 0's clock from one log step to the next, in both
modes; the first interval, which includes warm-up, is dropped). So it includes everything telemetry adds: the
per-step timestamps and, at every log step (trainer.log_every=10, the default), the one all_gather, the derived
fields, the straggler rule and the longer metrics row. The ratio is the median over the pairs of on/off - 1.

That with/without ratio is only as precise as two runs of the same config agree, which on a shared 2-core machine
is a few percent, more than the 1% target. So the cost is also measured directly, and the target is judged on it:
the time rank 0 spends inside Telemetry.collect in the same runs, plus the per-step hooks (timestamps, the data
and sync contexts) timed in a loop of their own, as a share of the step time without telemetry.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from bench.ports import hosted_port
from contract.rundir.metrics_file import read_file
from launcher.compose import compose_and_plan
from train import distributed
from train.loop import train
from train.observe.telemetry import StepTimer, Telemetry

TARGET_RATIO = 0.01
WORLD = 2
MODEL = ["model=gpt2_124m", "model.n_layers=4", "model.d_model=256", "model.n_heads=4", "model.ffn_hidden=1024",
         "model.vocab_size=2048", "data.seq_len=64", "trainer.micro_batch_size=2"]
STEPS, LOG_EVERY, PAIRS = 60, 10, 4
OVERRIDES = [*MODEL, f"trainer.log_every={LOG_EVERY}", "trainer.ckpt_every=0",
             "logger.backend=none", f"local.nproc={WORLD}"]


def _worker(rank: int, world: int, port: int, out_dir: str, runs: list[tuple[str, bool]], steps: int) -> None:
    spent = {"collect_s": 0.0, "collects": 0}
    collect = Telemetry.collect

    def timed_collect(self: Telemetry, step: int, strategy: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            return collect(self, step, strategy)
        finally:
            spent["collect_s"] += time.perf_counter() - t0
            spent["collects"] += 1

    Telemetry.collect = timed_collect  # type: ignore[method-assign]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURMTRAIN_LAUNCHER="local")
    torch.set_num_threads(1)
    env = distributed.detect()
    distributed.init_process_group(env, "gloo")
    try:
        for name, enabled in runs:
            cfg, _ = compose_and_plan([*OVERRIDES, f"trainer.max_steps={steps}",
                                       f"telemetry.enabled={str(enabled).lower()}"])
            run_dir = Path(out_dir) / name
            run_dir.mkdir(parents=True, exist_ok=True)
            spent.update(collect_s=0.0, collects=0)
            train(cfg, env, torch.device("cpu"), run_dir)
            if rank == 0 and enabled:
                (run_dir / "collect.json").write_text(json.dumps(spent))
    finally:
        distributed.destroy_process_group()


def step_times(metrics: Path, log_every: int = LOG_EVERY) -> list[float]:
    """Wall time per step of each log interval after the first, from the rows' tokens/s."""
    rows = read_file(metrics)
    out = []
    for prev, row in zip(rows, rows[1:], strict=False):
        if prev["step"] >= log_every:  # the interval from step 1 to log_every includes warm-up
            out.append((row["tokens"] - prev["tokens"]) / row["tokens_per_s"] / (row["step"] - prev["step"]))
    return out


def hook_cost_s(steps: int = 20000) -> float:
    """Seconds per step spent in the per-step hooks on CPU (empty step bodies; drained every LOG_EVERY steps)."""
    timer = StepTimer(torch.device("cpu"), enabled=True)
    t0 = time.perf_counter()
    for i in range(steps):
        timer.begin_step()
        with timer.data():
            pass
        with timer.synchronised(True):
            pass
        timer.end_step()
        if i % LOG_EVERY == 0:
            timer.drain()
    return (time.perf_counter() - t0) / steps


def run(quick: bool = False) -> dict[str, Any]:
    pairs, steps = (2, 30) if quick else (PAIRS, STEPS)
    order = [on for pair in range(pairs) for on in ((True, False) if pair % 2 == 0 else (False, True))]
    runs = [(f"{'on' if on else 'off'}{i}", on) for i, on in enumerate(order)]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(WORLD, hosted_port(WORLD), tmp, runs, steps), nprocs=WORLD)
        per_run = {name: statistics.median(step_times(Path(tmp) / name / "metrics.jsonl")) for name, _ in runs}
        collects = [json.loads((Path(tmp) / name / "collect.json").read_text()) for name, on in runs if on]
    collect_s = sum(c["collect_s"] for c in collects) / sum(c["collects"] for c in collects)
    hooks_s = hook_cost_s()
    on = [per_run[name] for name, enabled in runs if enabled]
    off = [per_run[name] for name, enabled in runs if not enabled]
    median_on, median_off = statistics.median(on), statistics.median(off)
    pair_ratios = [a / b - 1 for a, b in zip(on, off, strict=True)]
    ratio = statistics.median(pair_ratios)
    direct = (hooks_s + collect_s / LOG_EVERY) / median_off
    return {
        "benchmark": "telemetry_overhead",
        "config": [*OVERRIDES, f"trainer.max_steps={steps}"],
        "torch": torch.__version__,
        "world_size": WORLD,
        "steps_per_run": steps,
        "log_every": LOG_EVERY,
        "pairs": pairs,
        "quick": quick,
        "command": "python -m bench telemetry_overhead",
        "step_ms_telemetry_off": round(median_off * 1000, 3),
        "step_ms_telemetry_on": round(median_on * 1000, 3),
        "overhead_ratio": round(ratio, 4),
        "pair_ratios": [round(x, 4) for x in pair_ratios],
        "direct_cost_ratio": round(direct, 5),
        "collect_ms_per_log_step": round(collect_s * 1000, 3),
        "hooks_us_per_step": round(hooks_s * 1e6, 2),
        "target_ratio": TARGET_RATIO,
        "target_met": direct <= TARGET_RATIO,
        "step_ms_on_all": [round(t * 1000, 3) for t in on],
        "step_ms_off_all": [round(t * 1000, 3) for t in off],
    }


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    # Both as step time with telemetry / without it (1 + the overhead), the form of every other figure.
    return [{"figure": "telemetry cost, measured directly", "value": round(1 + r["direct_cost_ratio"], 5),
             "baseline": "step time without telemetry", "target": f"<= {1 + r['target_ratio']}",
             "met": r["target_met"], "detail": f"{r['collect_ms_per_log_step']:.2f} ms per log step + "
                                                f"{r['hooks_us_per_step']:.1f} us per step"},
            {"figure": f"telemetry on / off, {r['world_size']} ranks", "value": round(1 + r["overhead_ratio"], 4),
             "baseline": "the same run with telemetry.enabled=false", "target": None, "met": None,
             "detail": f"pairs range {min(r['pair_ratios']):+.1%} to {max(r['pair_ratios']):+.1%} (noise)"}]


def report(r: dict[str, Any]) -> str:
    verdict = "met" if r["target_met"] else "MISSED"
    return (f"telemetry_overhead: {r['world_size']} ranks, median step {r['step_ms_telemetry_off']:.2f} ms without "
            f"telemetry, {r['step_ms_telemetry_on']:.2f} ms with it (log every {r['log_every']} steps): with/without "
            f"{r['overhead_ratio']:+.2%} (median of {r['pairs']} adjacent pairs, which range "
            f"{min(r['pair_ratios']):+.1%} to {max(r['pair_ratios']):+.1%}: run-to-run noise). Measured directly: "
            f"{r['collect_ms_per_log_step']:.2f} ms per log step in collect + {r['hooks_us_per_step']:.1f} us per "
            f"step in the hooks = {r['direct_cost_ratio']:.2%} of step time (target <= {r['target_ratio']:.0%}: "
            f"{verdict})")
