"""What validation costs (issue 21, acceptance 6), measured in one run on one process:

1. One validation pass, `Validator.run` (train/evaluation/validator.py: eval mode, no_grad, the RNG streams forked,
   each set's micro batches as the first pass read and kept them (train/evaluation/set_batches.py), the
   token-weighted loss summed and all-reduced), against a bare forward-only loop over the same batches held in
   memory, what a user writes: the same model, eval mode and no_grad, forward and a summed cross-entropy. Target:
   at most 1.05x: a pass costs the forward and nothing more. A third arm runs the bare loop reading each micro batch
   from the same source with the same reader (train.data.batches.load_micro_batch), as the Validator did on every
   pass before it kept its sets: the ratio to it shows what keeping them saves. The first pass, which reads and
   keeps, is timed once (it is the warm-up). The three arms rotate their order each repetition, so a drift of the
   shared machine's speed cancels; a ratio is the median over the repetitions. All three run on this one thread (torch's intra-op threads set to 1), so the
   ratio is taken on the process's CPU time, which other processes on the shared cores do not stretch as they
   stretch wall time; the wall-time ratio is recorded beside it.
2. The training step with validation off (eval.every=0, the default: the loop builds a Validator that holds no
   set and asks `due(step)` each step) against the same loop with the Validator taken out (train.loop.Validator
   replaced by a stub that is never due: the loop as it was before issue 21), and against the bare training loop
   of bench/loop_overhead.py. Step times as loop_overhead measures them (metrics.jsonl's tokens/s per log interval,
   the first dropped, the median), the three arms in rotating order per round; the ratio is the median over the
   rounds, beside the ratio of each run's CPU seconds (the process, all threads; setup included, the same in
   both). Two runs of one config differ by a few percent on a shared 2-core machine, and by far more when other
   work crowds its cores, so the Validator's own per-step cost is timed directly too (`due(step)` in a loop of its
   own) as a share of the step: the target, ~1.00 (unchanged), is judged on that share (at most 0.1%) and the
   ratios are shown beside it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.bare_loop import LOG_EVERY, init_single_process
from bench.loop_overhead import CASES as LOOP_CASES
from bench.loop_overhead import COMMON
from bench.loop_overhead import bare as bare_training

COMMAND = "python -m bench validation_cost"
PASS_TARGET = 1.05
DIRECT_SHARE_TARGET = 0.001  # the Validator's per-step cost with eval.every=0, as a share of the step
CASES = {name: case["overrides"] for name, case in LOOP_CASES.items()}  # tiny and the 24M GPT-2 layout
# (eval.batches, pass repetitions) per case; steps per training run and rounds (tiny only: the per-step cost is what
# matters, and it is largest against tiny's short step).
FULL = {"pass": {"tiny": (8, 30), "gpt_24m": (2, 9)}, "steps": (100, 6)}
QUICK = {"pass": {"tiny": (4, 3), "gpt_24m": (1, 2)}, "steps": (40, 2)}


class NoValidator:
    """The loop without validation, as before issue 21: never due."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def due(self, step: int) -> bool:
        return False


def forward_only(model: Any, batches: Iterable[tuple[Any, Any]]) -> float:
    """The bare loop: the summed token loss over the batches."""
    import torch
    import torch.nn.functional as F

    from train.model.build import logits_of

    model.eval()
    total = 0.0
    with torch.no_grad():
        for inputs, targets in batches:
            logits = logits_of(model(inputs))
            total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                           reduction="sum"))
    model.train()
    return total


def pass_cost(name: str, batches: int, repetitions: int, env: Any) -> dict[str, Any]:
    import torch

    from launcher.compose import compose_and_plan
    from train.data.batches import load_micro_batch
    from train.evaluation.validator import Validator
    from train.loop import seed_everything
    from train.model.build import build_model
    from train.strategies import build_strategy

    overrides = [*COMMON, *CASES[name], "trainer.max_steps=10", "eval.every=10", f"eval.batches={batches}"]
    cfg, _ = compose_and_plan(overrides)
    device = torch.device("cpu")
    seed_everything(int(cfg.trainer.seed))
    strategy = build_strategy(cfg, env, device)
    model = strategy.setup(build_model(cfg.model))
    validator = Validator(cfg, strategy, device)
    in_memory = [load_micro_batch(source, indices) for source in validator.sets.values()
                 for indices in validator.micro_batches]
    arms = {"pass": lambda: validator.run(model),
            "bare_reading": lambda: forward_only(model, (load_micro_batch(source, indices)
                                                         for source in validator.sets.values()
                                                         for indices in validator.micro_batches)),
            "bare_in_memory": lambda: forward_only(model, in_memory)}
    c0 = time.process_time()
    arms["pass"]()  # the first pass reads and keeps the sets (and warms up)
    first_pass = time.process_time() - c0
    assert validator.set_batches.kept.keys() == validator.sets.keys(), "the Validator kept no batches"
    for arm in ("bare_reading", "bare_in_memory"):
        arms[arm]()  # warm-up
    cpu: dict[str, list[float]] = {arm: [] for arm in arms}
    wall: dict[str, list[float]] = {arm: [] for arm in arms}
    order = list(arms)
    for n in range(repetitions):
        for arm in order[n % 3:] + order[:n % 3]:
            c0, t0 = time.process_time(), time.perf_counter()
            arms[arm]()
            wall[arm].append(time.perf_counter() - t0)
            cpu[arm].append(time.process_time() - c0)
    ratios = _ratios(cpu, "pass", "bare_in_memory")
    ratio = statistics.median(ratios)
    return {"config": overrides, "sets": list(validator.sets), "micro_batches": len(in_memory),
            "tokens": sum(int(t.numel()) for _, t in in_memory), "repetitions": repetitions,
            **{f"{arm}_cpu_ms": round(statistics.median(v) * 1000, 3) for arm, v in cpu.items()},
            **{f"{arm}_wall_ms": round(statistics.median(v) * 1000, 3) for arm, v in wall.items()},
            "first_pass_cpu_ms": round(first_pass * 1000, 3),
            "ratio": round(ratio, 4), "ratios": [round(r, 4) for r in ratios],
            "ratio_wall": round(statistics.median(_ratios(wall, "pass", "bare_in_memory")), 4),
            "ratio_to_reading": round(statistics.median(_ratios(cpu, "pass", "bare_reading")), 4),
            "target_ratio": PASS_TARGET, "target_met": ratio <= PASS_TARGET}


def _ratios(times: dict[str, list[float]], a: str, b: str) -> list[float]:
    return [x / y for x, y in zip(times[a], times[b], strict=True)]


def due_cost_s(steps: int = 200_000) -> float:
    """Seconds per step the loop spends asking an eval.every=0 Validator whether it is due."""
    from launcher.compose import compose_and_plan
    from train.evaluation.validator import Validator

    cfg, _ = compose_and_plan([*COMMON, *CASES["tiny"], "trainer.max_steps=10"])

    class NoStrategy:  # eval.every=0 reads nothing from the strategy but the data-parallel rank and size
        dp_rank, dp_size = 0, 1

    validator = Validator(cfg, NoStrategy(), None)  # type: ignore[arg-type]
    due = validator.due
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        due(step)
    return (time.perf_counter() - t0) / steps


def step_cost(steps: int, rounds: int, env: Any, tmp: Path) -> dict[str, Any]:
    import torch

    import train.loop as loop
    from bench.telemetry_overhead import step_times
    from launcher.compose import compose_and_plan

    overrides = [*COMMON, *CASES["tiny"], f"trainer.max_steps={steps}", "eval.every=0"]
    cfg, _ = compose_and_plan(overrides)
    real = loop.Validator
    warm_up = tmp / "warm_up"
    warm_up.mkdir(parents=True)
    loop.train(cfg, env, torch.device("cpu"), warm_up)  # the process's first run pays one-time costs: not timed
    times: dict[str, list[float]] = {"eval_off": [], "no_validator": [], "bare": []}
    cpu: dict[str, list[float]] = {arm: [] for arm in times}  # the process's CPU seconds per run, all threads
    order = list(times)
    for n in range(rounds):
        for arm in order[n % 3:] + order[:n % 3]:
            c0 = time.process_time()
            if arm == "bare":
                times[arm].append(bare_training(cfg, steps))
                cpu[arm].append(time.process_time() - c0)
                continue
            run_dir = tmp / f"{arm}_{n}"
            run_dir.mkdir(parents=True)
            loop.Validator = real if arm == "eval_off" else NoValidator  # type: ignore[misc]
            try:
                loop.train(cfg, env, torch.device("cpu"), run_dir)
            finally:
                loop.Validator = real  # type: ignore[misc]
            cpu[arm].append(time.process_time() - c0)
            times[arm].append(statistics.median(step_times(run_dir / "metrics.jsonl", LOG_EVERY)))
    ratios = _ratios(times, "eval_off", "no_validator")
    step_s = statistics.median(times["no_validator"])
    direct = due_cost_s()
    share = direct / step_s
    return {"config": overrides, "steps_per_run": steps, "rounds": rounds,
            "step_ms": {arm: round(statistics.median(v) * 1000, 3) for arm, v in times.items()},
            "run_cpu_s": {arm: round(statistics.median(v), 3) for arm, v in cpu.items()},
            "ratio": round(statistics.median(ratios), 4), "round_ratios": [round(r, 4) for r in ratios],
            "cpu_ratio": round(statistics.median(_ratios(cpu, "eval_off", "no_validator")), 4),
            "ratio_to_bare": round(statistics.median(_ratios(times, "eval_off", "bare")), 4),
            "due_ns_per_step": round(direct * 1e9, 1), "direct_share": round(share, 7),
            "target_share": DIRECT_SHARE_TARGET, "target_met": share <= DIRECT_SHARE_TARGET}


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    from train import distributed

    torch.set_num_threads(1)  # as every rank runs (trainer.cpu_threads=1)
    plan = QUICK if quick else FULL
    env = init_single_process()
    try:
        cases = {name: pass_cost(name, *plan["pass"][name], env) for name in CASES}
        with tempfile.TemporaryDirectory() as tmp:
            steps = step_cost(*plan["steps"], env, Path(tmp))
    finally:
        distributed.destroy_process_group()
    return {"benchmark": "validation_cost", "torch": torch.__version__, "device": "cpu", "world_size": 1,
            "quick": quick, "pass": cases, "validation_off": steps,
            "target_met": all(c["target_met"] for c in cases.values()) and steps["target_met"],
            "command": COMMAND + (" --quick" if quick else "")}


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, c in r["pass"].items():
        rows.append({"figure": f"validation pass, {name} ({', '.join(c['sets'])}: {c['micro_batches']} micro "
                               f"batches, {c['tokens']:,} tokens)", "value": c["ratio"],
                     "baseline": "bare forward-only loop over the same batches in memory",
                     "target": f"<= {c['target_ratio']}x", "met": c["target_met"],
                     "detail": f"CPU {c['pass_cpu_ms']:.1f} ms vs {c['bare_in_memory_cpu_ms']:.1f} ms (wall ratio "
                               f"{c['ratio_wall']:.3f}); {c['ratio_to_reading']:.3f}x the bare loop reading each "
                               f"batch ({c['bare_reading_cpu_ms']:.1f} ms); the first pass, which reads and keeps "
                               f"the sets, {c['first_pass_cpu_ms']:.1f} ms"})
    s = r["validation_off"]
    rows.append({"figure": "training step, eval.every=0 (tiny)", "value": s["ratio"],
                 "baseline": "the same loop without the Validator (before issue 21)",
                 "target": f"Validator <= {s['target_share']:.1%} of the step", "met": s["target_met"],
                 "detail": f"{s['step_ms']['eval_off']:.1f} ms vs {s['step_ms']['no_validator']:.1f} ms a step "
                           f"(CPU per run {s['cpu_ratio']:.3f}x); due() {s['due_ns_per_step']:.0f} ns/step = "
                           f"{s['direct_share']:.5%} of the step; {s['ratio_to_bare']:.3f}x the bare training loop"})
    return rows


def report(r: dict[str, Any]) -> str:
    lines = [f"validation_cost ({r['command']}):"]
    for row in figures(r):
        met = "met" if row["met"] else "MISSED"
        lines.append(f"  {row['figure']}: {row['value']:.3f}x {row['baseline']} (target {row['target']}: {met}); "
                     f"{row['detail']}")
    return "\n".join(lines)
