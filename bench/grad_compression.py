"""What strategy.grad_compression sends and what it costs in loss (issue 46): the tiny model under DDP on CPU ranks
over gloo, one run per choice (none, bf16, fp16, powersgd at rank 4), the same data and seed.

Bytes: what each rank hands to all-reduce in one step, counted where it is handed over: for a compression, every
tensor the communication hook passes to torch.distributed.all_reduce (PowerSGD's uncompressed vectors, its P and
its Q), attributed to the step whose first bucket started it; for none, DDP's own buckets (the reducer all-reduces
each whole, in C++, with no Python to count in), read off the reducer. The figure is the last step's (PowerSGD
compresses only after the learning-rate warmup). A ring all-reduce sends 2 (n - 1) / n times its input from each
rank, the same factor for every choice, so the ratios are the ratios of bytes on the wire.

Loss: the mean of the last LAST logged losses of each run, against none's. Targets: bf16 sends at most half of
none's bytes, PowerSGD rank 4 at most a tenth; every loss within 2% of none's.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

COMMAND = "python -m bench grad_compression"
WORLD = 2
KINDS = ("none", "bf16", "fp16", "powersgd")
RANK = 4
STEPS, QUICK_STEPS, LAST = 200, 60, 10
TARGET_BYTES = {"bf16": 0.5, "fp16": 0.5, "powersgd": 0.1}
TARGET_LOSS = 0.02
OVERRIDES = ["model=tiny", "strategy=ddp", "logger.backend=none", "trainer.ckpt_every=0", "trainer.log_every=1",
             "trainer.progress_bar=false", f"strategy.powersgd_rank={RANK}"]


class _Counter:
    """Bytes handed to all_reduce by the communication hooks, per step (a step starts with its bucket 0)."""

    def __init__(self) -> None:
        self.step = 0
        self.bytes: dict[int, int] = {}

    def install(self) -> None:
        import torch.distributed as dist

        from train.strategies import grad_compression

        all_reduce, register = dist.all_reduce, grad_compression.DDPCompression.register
        counter = self

        def counted_all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("torch.distributed.algorithms.ddp_comm_hooks"):
                counter.bytes[counter.step] = counter.bytes.get(counter.step, 0) + tensor.numel() * tensor.element_size()
            return all_reduce(tensor, *args, **kwargs)

        def counted_register(self: Any, ddp: Any) -> None:
            hook = self.hook

            def stepping_hook(state, bucket):  # type: ignore[no-untyped-def]
                if bucket.index() == 0:
                    counter.step += 1
                return hook(state, bucket)

            self.hook = stepping_hook
            register(self, ddp)

        dist.all_reduce = counted_all_reduce
        grad_compression.DDPCompression.register = counted_register  # type: ignore[method-assign]


def _worker(rank: int, world: int, port: int, out_dir: str, steps: int) -> None:
    import torch

    from bench.loop_overhead import join_gloo
    from contract.rundir.metrics_file import FILE_NAME, read_file
    from launcher.compose import compose_and_plan
    from train import distributed
    from train.loop import train

    env = join_gloo(rank, world, port)
    counter = _Counter()
    counter.install()
    out: dict[str, Any] = {}
    try:
        for kind in KINDS:
            cfg = compose_and_plan([*OVERRIDES, f"local.nproc={world}", f"trainer.max_steps={steps}",
                                    f"strategy.grad_compression={kind}"])[0]
            run_dir = Path(out_dir) / kind
            run_dir.mkdir(parents=True, exist_ok=True)
            counter.step, counter.bytes = 0, {}
            result = train(cfg, env, torch.device("cpu"), run_dir)
            if kind == "none":
                buckets = result.model.reducer._get_zeros_like_grad_buckets()
                sent = sum(b.buffer().numel() * b.buffer().element_size() for b in buckets)
            else:
                assert counter.step == steps, (kind, counter.step)
                sent = counter.bytes[steps]
            if rank == 0:
                losses = [r["loss"] for r in read_file(run_dir / FILE_NAME)]
                out[kind] = {"bytes_per_step": sent, "final_loss": statistics.fmean(losses[-LAST:]),
                             "first_loss": losses[0],
                             "parameters": sum(p.numel() for p in result.model.parameters())}
        if rank == 0:
            (Path(out_dir) / "result.json").write_text(json.dumps(out))
    finally:
        distributed.destroy_process_group()


def run(quick: bool = False) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from bench.ports import hosted_port

    steps = QUICK_STEPS if quick else STEPS
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(WORLD, hosted_port(WORLD), tmp, steps), nprocs=WORLD)
        measured = json.loads((Path(tmp) / "result.json").read_text())
    none = measured["none"]
    cases = {}
    for kind, m in measured.items():
        ratio = m["bytes_per_step"] / none["bytes_per_step"]
        loss_change = m["final_loss"] / none["final_loss"] - 1
        met = ratio <= TARGET_BYTES.get(kind, 1.0) and abs(loss_change) <= TARGET_LOSS
        cases[kind] = {**m, "bytes_ratio": round(ratio, 4), "loss_change": round(loss_change, 5),
                       "target_bytes_ratio": TARGET_BYTES.get(kind), "target_met": met}
    return {"command": COMMAND, "quick": quick, "world_size": WORLD, "steps": steps, "powersgd_rank": RANK,
            "cases": cases, "target_met": all(c["target_met"] for c in cases.values())}


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for kind, c in r["cases"].items():
        if kind == "none":
            continue
        name = f"{kind} rank {r['powersgd_rank']}" if kind == "powersgd" else kind
        rows.append({"figure": f"gradient bytes per step, {name} / none, ddp {r['world_size']} ranks, tiny model",
                     "value": c["bytes_ratio"], "baseline": "no compression",
                     "target": f"<= {c['target_bytes_ratio']}", "met": c["target_met"],
                     "detail": f"{c['bytes_per_step']:,} of {r['cases']['none']['bytes_per_step']:,} bytes; loss "
                               f"after {r['steps']} steps {c['final_loss']:.4f} ({c['loss_change']:+.2%})"})
    return rows


def report(r: dict[str, Any]) -> str:
    none = r["cases"]["none"]
    lines = [f"grad_compression: bytes each rank hands to all-reduce per step and the loss after {r['steps']} steps "
             f"(mean of the last {LAST}), ddp {r['world_size']} ranks on gloo, tiny model "
             f"({none['parameters']:,} parameters)"]
    for kind, c in r["cases"].items():
        target = "" if kind == "none" else (f" (targets: bytes <= {c['target_bytes_ratio']}, loss within "
                                            f"{TARGET_LOSS:.0%}: {'met' if c['target_met'] else 'MISSED'})")
        lines.append(f"  {kind:9s} {c['bytes_per_step']:>9,} bytes ({c['bytes_ratio']:.3f} of none), loss "
                     f"{c['first_loss']:.4f} -> {c['final_loss']:.4f} ({c['loss_change']:+.2%}){target}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(run(quick="--quick" in sys.argv)))
