"""What the replica consistency check (issue 22, train/stability/replicas.py) costs: one check's time (every
parameter fingerprinted on each rank, the small vectors all-gathered on gloo, the vote) against the step time of
the same model under DDP on 2 ranks, as the share of training time at the default interval
(stability.replica_check_every): check time / (interval x step time).

Both measured in the same processes, one after the other: the step time as bench/loop_overhead.py measures it (the
median over intervals of LOG_EVERY steps of train.loop.train, the first interval dropped, the periodic check off),
then the check on the weights that run left, timed over CHECKS calls on every rank (the median of rank 0's).
Target: at most 1% of training time.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.loop_overhead import CASES, COMMON, DDP_WORLD, LOG_EVERY, join_gloo

COMMAND = "python -m bench replica_check"
TARGET = 0.01
FULL = {"tiny": 60, "gpt_24m": 30}
QUICK = {"tiny": 30, "gpt_24m": 20}
CHECKS = 20


class _Replicas:
    """The DDP strategy's replica_set over a trained model (train.strategies.base.Strategy.replica_set)."""

    name = "ddp"

    def __init__(self, model: Any) -> None:
        self.model = model

    def replica_set(self) -> tuple[tuple[int, ...], list[tuple[str, Any]]]:
        return (), list(getattr(self.model, "module", self.model).named_parameters())


def _worker(rank: int, world: int, port: int, out_dir: str, plan: dict[str, int]) -> None:
    import torch

    from bench.telemetry_overhead import step_times
    from launcher.compose import compose_and_plan
    from train import distributed
    from train.loop import train
    from train.stability.replicas import ReplicaCheck

    env = join_gloo(rank, world, port)
    out: dict[str, Any] = {}
    try:
        for name, steps in plan.items():
            cfg = compose_and_plan([*COMMON, *CASES[name]["overrides"], f"local.nproc={world}", "strategy=ddp",
                                    f"trainer.max_steps={steps}", "stability.replica_check_every=0"])[0]
            run_dir = Path(out_dir) / f"ddp_{name}"
            if rank == 0:
                run_dir.mkdir(parents=True)
            torch.distributed.barrier()
            result = train(cfg, env, torch.device("cpu"), run_dir)
            check = ReplicaCheck(1, env, _Replicas(result.model))
            params = sum(t.numel() for t in check.tensors)
            times = []
            for step in range(1, CHECKS + 1):
                torch.distributed.barrier()
                start = time.perf_counter()
                assert check.check(step) is None, "the replicas disagree"
                times.append(time.perf_counter() - start)
            if rank == 0:
                out[name] = {"step_ms": statistics.median(step_times(run_dir / "metrics.jsonl", LOG_EVERY)) * 1000,
                             "check_ms": statistics.median(times) * 1000, "tensors": len(check.tensors),
                             "parameters": params}
        if rank == 0:
            (Path(out_dir) / "times.json").write_text(json.dumps(out))
    finally:
        distributed.destroy_process_group()


def run(quick: bool = False) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from bench.ports import hosted_port
    from contract.config.schema import StabilityConfig

    every = StabilityConfig.replica_check_every
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(DDP_WORLD, hosted_port(DDP_WORLD), tmp, QUICK if quick else FULL), nprocs=DDP_WORLD)
        measured = json.loads((Path(tmp) / "times.json").read_text())
    cases = {}
    for name, m in measured.items():
        share = m["check_ms"] / (every * m["step_ms"])
        cases[name] = {"world_size": DDP_WORLD, "parameters": m["parameters"], "tensors": m["tensors"],
                       "step_ms": round(m["step_ms"], 3), "check_ms": round(m["check_ms"], 3),
                       "check_in_steps": round(m["check_ms"] / m["step_ms"], 3), "share": round(share, 6),
                       "target_share": TARGET, "target_met": share <= TARGET}
    return {"command": COMMAND, "quick": quick, "replica_check_every": every, "cases": cases,
            "target_met": all(c["target_met"] for c in cases.values())}


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"figure": f"replica check share of training time, {name}, ddp {c['world_size']} ranks, every "
                       f"{r['replica_check_every']} steps", "value": c["share"], "baseline": "no check",
             "target": f"<= {TARGET:.0%}", "met": c["target_met"],
             "detail": f"one check {c['check_ms']:.2f} ms = {c['check_in_steps']:.2f} steps of {c['step_ms']:.2f} ms"}
            for name, c in r["cases"].items()]


def report(r: dict[str, Any]) -> str:
    lines = [f"replica_check: one check against the step time, ddp {DDP_WORLD} ranks, every "
             f"{r['replica_check_every']} steps"]
    for name, c in r["cases"].items():
        lines.append(f"  {name} ({c['parameters']:,} parameters in {c['tensors']} tensors): check {c['check_ms']:.2f} ms, "
                     f"step {c['step_ms']:.2f} ms: {c['share']:.3%} of training time (target <= {TARGET:.0%}: "
                     f"{'met' if c['target_met'] else 'MISSED'})")
    return "\n".join(lines)
