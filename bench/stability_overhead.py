"""What the stability checks (issue 22) cost the training loop: median step time of train.loop.train with every
check on (stability.enabled=true and the spike rule, stability.spike_sigma=6, which adds an on-device all-reduce of
the loss) against every check off (stability.enabled=false), the same config otherwise, in one run: `tiny` and
`gpt_24m` (bench/loop_overhead.py's cases) in one process, and DDP on 2 ranks.

Timing as bench/loop_overhead.py: wall time per step over intervals of LOG_EVERY steps from metrics.jsonl, the
first interval dropped, the median; arms in adjacent pairs in alternating order, the ratio the median over the
pairs of on / off. Beside it, measured directly in the same process: the checks' own cost per step (the verdict,
the hand-over of its code and the host's reading, timed over many calls on a real gradient norm) as a share of
the step: a figure the shared machine's drift does not blur. Target (issue 22): at most 1.02x.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bare_loop import LOG_EVERY, init_single_process
from bench.loop_overhead import CASES, COMMON, DDP_WORLD, join_gloo, ours

COMMAND = "python -m bench stability_overhead"
TARGET = 1.02
ON = ["stability.enabled=true", "stability.spike_sigma=6"]
OFF = ["stability.enabled=false"]
FULL = {"tiny": (60, 4), "gpt_24m": (30, 2)}
DDP_FULL = {"tiny": (60, 3), "gpt_24m": (30, 1)}
QUICK = {"tiny": (30, 1), "gpt_24m": (20, 1)}
HOOK_CALLS = 2000


def hook_us_per_step() -> float:
    """The checks' own time per step on this CPU: verdict (spike rule on), code hand-over, the host's read."""
    import torch

    from train.stability.codes import DeviceCodes
    from train.stability.monitor import Monitor
    from train.stability.verdict import SpikeRule, StepVerdict, skip_flag

    device = torch.device("cpu")
    verdict = StepVerdict(SpikeRule(6.0, 128, device), 1, device, fp16=False)
    codes, monitor = DeviceCodes(device), Monitor("skip", 3, 3, 0)
    loss, norm = torch.tensor(2.5), torch.tensor(0.7)
    start = time.perf_counter()
    for step in range(HOOK_CALLS):
        code = verdict(loss, norm)
        skip_flag(code)
        codes.push(step, code)
        for s, c in codes.ready():
            monitor.observe(s, c)
        monitor.action()
    return (time.perf_counter() - start) / HOOK_CALLS * 1e6


def _pairs(name: str, steps: int, pairs: int, env: Any, tmp: Path) -> dict[str, Any]:
    from launcher.compose import compose_and_plan

    base = [*COMMON, *CASES[name]["overrides"], f"trainer.max_steps={steps}"]
    cfgs = {arm: compose_and_plan([*base, *keys])[0] for arm, keys in (("on", ON), ("off", OFF))}
    times: dict[str, list[float]] = {"on": [], "off": []}
    for pair in range(pairs):
        for arm in (["on", "off"] if pair % 2 == 0 else ["off", "on"]):
            times[arm].append(ours(cfgs[arm], env, tmp / f"{name}_{arm}_{pair}"))
    return _summary(times, steps, pairs)


def _summary(times: dict[str, list[float]], steps: int, pairs: int) -> dict[str, Any]:
    ratios = [a / b for a, b in zip(times["on"], times["off"], strict=True)]
    ratio = statistics.median(ratios)
    return {"steps_per_run": steps, "pairs": pairs, "step_ms_on": round(statistics.median(times["on"]) * 1000, 3),
            "step_ms_off": round(statistics.median(times["off"]) * 1000, 3), "ratio": round(ratio, 4),
            "pair_ratios": [round(r, 4) for r in ratios], "target_ratio": TARGET, "target_met": ratio <= TARGET}


def _ddp_worker(rank: int, world: int, port: int, out_dir: str, plan: dict[str, tuple[int, int]]) -> None:
    import torch

    from bench.telemetry_overhead import step_times
    from launcher.compose import compose_and_plan
    from train import distributed
    from train.loop import train

    env = join_gloo(rank, world, port)
    times: dict[str, dict[str, list[float]]] = {}
    try:
        for name, (steps, pairs) in plan.items():
            base = [*COMMON, *CASES[name]["overrides"], f"local.nproc={world}", "strategy=ddp",
                    f"trainer.max_steps={steps}"]
            cfgs = {arm: compose_and_plan([*base, *keys])[0] for arm, keys in (("on", ON), ("off", OFF))}
            times[name] = {"on": [], "off": []}
            for pair in range(pairs):
                for arm in (["on", "off"] if pair % 2 == 0 else ["off", "on"]):
                    run_dir = Path(out_dir) / f"ddp_{name}_{arm}_{pair}"
                    if rank == 0:
                        run_dir.mkdir(parents=True)
                    torch.distributed.barrier()
                    train(cfgs[arm], env, torch.device("cpu"), run_dir)
                    if rank == 0:
                        times[name][arm].append(statistics.median(step_times(run_dir / "metrics.jsonl", LOG_EVERY)))
        if rank == 0:
            (Path(out_dir) / "times.json").write_text(json.dumps(times))
    finally:
        distributed.destroy_process_group()


def run(quick: bool = False) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from bench.ports import hosted_port
    from train import distributed

    plan, ddp_plan = (QUICK, QUICK) if quick else (FULL, DDP_FULL)
    hook_us = hook_us_per_step()
    with tempfile.TemporaryDirectory() as tmp:
        env = init_single_process()
        try:
            cases = {name: _pairs(name, *plan[name], env, Path(tmp)) for name in plan}
        finally:
            distributed.destroy_process_group()
        mp.spawn(_ddp_worker, args=(DDP_WORLD, hosted_port(DDP_WORLD), tmp, ddp_plan), nprocs=DDP_WORLD)
        ddp_times = json.loads((Path(tmp) / "times.json").read_text())
    ddp = {name: {"world_size": DDP_WORLD, **_summary(t, *ddp_plan[name])} for name, t in ddp_times.items()}
    for case in cases.values():
        case["hook_share"] = round(hook_us / (case["step_ms_off"] * 1000), 5)
    return {"command": COMMAND, "quick": quick, "hook_us_per_step": round(hook_us, 2), "cases": cases, "ddp": ddp,
            "target_met": all(c["target_met"] for c in [*cases.values(), *ddp.values()])}


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for where, group in (("1 process", r["cases"]), (f"ddp {DDP_WORLD} ranks", r["ddp"])):
        for name, c in group.items():
            rows.append({"figure": f"checks on / off, {name}, {where}", "value": c["ratio"], "baseline": "checks off",
                         "target": f"<= {TARGET}", "met": c["target_met"],
                         "detail": f"{c['step_ms_on']:.2f} / {c['step_ms_off']:.2f} ms per step, pairs "
                                   f"{min(c['pair_ratios']):.3f}-{max(c['pair_ratios']):.3f}"})
    return rows


def report(r: dict[str, Any]) -> str:
    shares = ", ".join(f"{n} {c['hook_share']:.3%}" for n, c in r["cases"].items())
    lines = [f"stability_overhead: the checks' own cost {r['hook_us_per_step']:.1f} us per step ({shares} of a step)"]
    for where, group in (("1 process", r["cases"]), (f"ddp {DDP_WORLD} ranks", r["ddp"])):
        for name, c in group.items():
            lines.append(f"  {name}, {where}: on {c['step_ms_on']:.2f} ms / off {c['step_ms_off']:.2f} ms per step = "
                         f"{c['ratio']:.3f}x (pairs {', '.join(f'{x:.3f}' for x in c['pair_ratios'])}; target <= "
                         f"{TARGET}: {'met' if c['target_met'] else 'MISSED'})")
    return "\n".join(lines)
