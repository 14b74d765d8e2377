"""The launch plan's memory estimate against what a rank really holds: on 2 CPU ranks always, on one GPU where
there is CUDA.

CPU (gloo, 2 ranks, a 2.2M-parameter model of our transformer): for each strategy that lays the states out
differently, the estimate's terms (`plan.fit.estimate` of launcher.compose.compose_and_plan) against
train/observe/memory.py's measurements in the real loop (train.loop.train_step):
- states: parameters + gradients + optimizer state, the unique tensor storages reachable from the model and the
  optimizer at the peak of a step (tests/dist/test_memory_estimate.py holds every strategy to 5%: the target);
- activations: the bytes autograd saves for backward per micro batch (saved_tensors_hooks over a step of two
  micro batches' samples less a step of one, so weights and their copies drop out), without and with activation
  checkpointing. tests/unit/test_estimate.py holds fp32 to 15%: the target there; bf16 rows have none.
Each as a ratio estimate / measured, for the rank farthest from 1.

CUDA (gpt2_124m and gpt2_350m, strategy=single, fp32 and bf16, with and without activation checkpointing): the
estimate without its margin (the margin stands for the CUDA context and fragmentation, which the allocator's count
does not include) against the peak `torch.cuda.max_memory_allocated` reaches over three optimizer steps of the real
loop, less what was allocated before the row began (a process that trained before, as make gpu-check's does, still
holds compiled graphs' memory: on an H200 that was 15 GB, counted once in every row until this baseline). Target:
estimate / measured within CUDA_TOLERANCE; a "skipped: no CUDA" row without a GPU.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

COMMAND = "python -m bench memory_estimate"
WORLD = 2
STATES_TOLERANCE = 0.05  # tests/dist/test_memory_estimate.py
ACTIVATIONS_TOLERANCE = 0.15  # tests/unit/test_estimate.py (fp32)
CUDA_TOLERANCE = 0.15  # the whole estimate less its margin against the allocator's peak on one GPU
MODEL = ["model.d_model=128", "model.n_layers=8", "model.n_heads=4", "model.ffn_hidden=512", "model.vocab_size=1000",
         "data.seq_len=32", "trainer.micro_batch_size=2"]
# name -> (overrides, what to measure). Without checkpointing a run measures both; with it only the activations
# (checkpointing changes no state).
STATES_AND_ACTIVATIONS = ("states", "activations")
CPU_RUNS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    **{s: ([f"strategy={s}"], STATES_AND_ACTIVATIONS)
       for s in ("ddp", "fsdp", "fsdp_grad_op", "zero1", "zero2", "zero3")},
    # bf16 two ways: autocast over fp32 weights (torch strategies); DeepSpeed's bf16 module with fp32 master.
    "ddp bf16": (["strategy=ddp", "precision=bf16"], STATES_AND_ACTIVATIONS),
    "zero1 bf16": (["strategy=zero1", "precision=bf16"], STATES_AND_ACTIVATIONS),
    "ddp checkpointing": (["strategy=ddp", "strategy.activation_checkpointing=true"], ("activations",)),
    "fsdp checkpointing": (["strategy=fsdp", "strategy.activation_checkpointing=true"], ("activations",)),
    "ddp bf16 checkpointing": (["strategy=ddp", "precision=bf16", "strategy.activation_checkpointing=true"],
                               ("activations",)),
    "zero1 bf16 checkpointing": (["strategy=zero1", "precision=bf16", "strategy.activation_checkpointing=true"],
                                 ("activations",)),
}
QUICK_RUNS = ("ddp", "fsdp", "zero1", "ddp checkpointing")

CUDA_CASES = [(model, precision, ac) for model in ("gpt2_124m", "gpt2_350m") for precision in ("fp32", "bf16")
              for ac in (False, True)]
CUDA_COMMON = ["strategy=single", "local.nproc=1", "logger.backend=none", "trainer.micro_batch_size=8",
               "data.seq_len=1024", "launcher.force=true"]


def _cpu_worker(rank: int, world: int, port: int, out_dir: str,
                runs: dict[str, tuple[list[str], tuple[str, ...]]]) -> None:
    import torch

    from launcher.compose import compose_and_plan
    from train import distributed
    from train.observe.memory import estimated_memory, measure_memory

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURMTRAIN_LAUNCHER="local")
    torch.set_num_threads(1)
    env = distributed.detect()
    distributed.init_process_group(env, "gloo")
    results = {}
    try:
        for name, (overrides, components) in runs.items():
            t0 = time.perf_counter()
            cfg, plan = compose_and_plan([f"local.nproc={world}", "logger.backend=none", *MODEL, *overrides])
            assert plan.fit is not None
            measured = measure_memory(cfg, env, torch.device("cpu"), states="states" in components,
                                      activations="activations" in components)
            estimated = estimated_memory(plan.fit.estimate)
            results[name] = {c: {"measured": measured[c], "estimated": estimated[c]} for c in components}
            results[name]["seconds"] = time.perf_counter() - t0
    finally:
        distributed.destroy_process_group()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))


def _cpu_row(name: str, overrides: list[str], component: str, per_rank: list[dict[str, float]]) -> dict[str, Any]:
    ratios = [r["estimated"] / r["measured"] for r in per_rank]
    ratio = max(ratios, key=lambda x: abs(x - 1))
    checkpointing = "strategy.activation_checkpointing=true" in overrides
    precision = next((o.split("=")[1] for o in overrides if o.startswith("precision=")), "fp32")
    if component == "states":
        tolerance: float | None = STATES_TOLERANCE
    else:
        tolerance = ACTIVATIONS_TOLERANCE if precision == "fp32" else None
    return {"run": name, "strategy": overrides[0].split("=")[1], "precision": precision,
            "activation_checkpointing": checkpointing, "component": component, "overrides": overrides,
            "estimated_bytes": per_rank[0]["estimated"], "measured_bytes_per_rank": [r["measured"] for r in per_rank],
            "ratio": ratio, "ratios_per_rank": ratios, "tolerance": tolerance,
            "target_met": None if tolerance is None else abs(ratio - 1) <= tolerance}


def run_cpu(quick: bool = False) -> dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    from bench.ports import hosted_port

    runs = {name: spec for name, spec in CPU_RUNS.items() if not quick or name in QUICK_RUNS}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_cpu_worker, args=(WORLD, hosted_port(WORLD), tmp, runs), nprocs=WORLD)
        per_rank = [json.loads((Path(tmp) / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    rows = [_cpu_row(name, overrides, component, [r[name][component] for r in per_rank])
            for name, (overrides, components) in runs.items() for component in components]
    return {"device": "cpu", "backend": "gloo", "world_size": WORLD, "torch": torch.__version__,
            "config": [f"local.nproc={WORLD}", *MODEL], "rows": rows, "seconds": round(time.perf_counter() - t0, 1),
            "seconds_per_run": {name: round(per_rank[0][name]["seconds"], 1) for name in runs},
            "target_met": all(r["target_met"] is not False for r in rows)}


def run_cuda(quick: bool = False) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return last_cuda_measurement(quick) or {"skipped": "no CUDA"}
    from launcher.compose import compose_and_plan
    from train import distributed
    from train.data import build_source
    from train.loop import seed_everything
    from train.model.transformer import build_model
    from train.step import TrainState, train_step
    from train.strategies import build_strategy

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), SLURMTRAIN_LAUNCHER="local")
    env = distributed.detect()
    distributed.init_process_group(env, "nccl")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # initialise the allocator before reading its statistics
    rows: list[dict[str, Any]] = []
    try:
        for model_name, precision, ac in [c for c in CUDA_CASES if not quick or c[0] == "gpt2_124m"]:
            cfg, plan = compose_and_plan([f"model={model_name}", f"precision={precision}",
                                          f"strategy.activation_checkpointing={str(ac).lower()}", *CUDA_COMMON])
            assert plan.fit is not None
            est = plan.fit.estimate
            seed_everything(0)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            strategy = build_strategy(cfg, env, device)
            model = strategy.setup(build_model(cfg.model))
            source = build_source(cfg.data, cfg.model.vocab_size)
            state = TrainState()
            for _ in range(3):
                train_step(model, strategy, source, state, cfg, env, device)
                strategy.optimizer_step()
                state.samples += cfg.trainer.global_batch_size
            torch.cuda.synchronize(device)
            measured = torch.cuda.max_memory_allocated(device) - before
            estimated = est.total - est.margin
            rows.append({"model": model_name, "precision": precision, "activation_checkpointing": ac,
                         "estimated_gb": estimated / 2**30, "measured_gb": measured / 2**30,
                         "allocated_before_gb": before / 2**30, "ratio": estimated / measured,
                         "target_met": abs(estimated / measured - 1) <= CUDA_TOLERANCE, "estimate": est.as_gb()})
            del strategy, model, source, state
            torch.cuda.empty_cache()
    finally:
        distributed.destroy_process_group()
    worst = max(abs(r["ratio"] - 1) for r in rows)
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
            "worst_relative_error": worst, "tolerance": CUDA_TOLERANCE, "target_met": worst <= CUDA_TOLERANCE,
            "quick": quick, "command": COMMAND}


def run(quick: bool = False) -> dict[str, Any]:
    cpu = run_cpu(quick)
    cuda = run_cuda(quick)
    return {"benchmark": "memory_estimate", **cpu, "cuda": cuda, "quick": quick,
            "target_met": cpu["target_met"] and cuda.get("target_met", True),
            "command": COMMAND + (" --quick" if quick else "")}


def _cpu_figure(x: dict[str, Any]) -> dict[str, Any]:
    what = ("params + grads + optimizer state" if x["component"] == "states"
            else "activations, checkpointed" if x["activation_checkpointing"] else "activations")
    baseline = ("held per rank (tensor storages at the step's peak)" if x["component"] == "states"
                else "saved for backward per micro batch (saved_tensors_hooks)")
    tolerance = x["tolerance"]
    measured = "/".join(f"{b / 2**20:.2f}" for b in x["measured_bytes_per_rank"])
    return {"figure": f"{x['strategy']} {x['precision']}: {what}", "value": round(x["ratio"], 4),
            "baseline": f"{baseline}, 2 CPU ranks",
            "target": None if tolerance is None else f"{1 - tolerance:g}-{1 + tolerance:g}",
            "met": x["target_met"],
            "detail": f"{x['estimated_bytes'] / 2**20:.2f} MiB vs {measured} MiB (rank 0/1)"}


def last_cuda_measurement(quick: bool) -> dict[str, Any] | None:
    """The GPU rows stored by the last run that had CUDA, so that a CPU-only `make bench` does not erase them;
    marked `kept` with when and where they were measured."""
    from bench.registry import RESULTS

    path = (RESULTS / "quick" if quick else RESULTS) / "memory_estimate.json"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    cuda = stored.get("cuda", stored)  # stored before the CPU part existed: the CUDA result alone
    if not isinstance(cuda, dict) or "rows" not in cuda or "device" not in cuda:
        return None
    when = cuda.get("measured_at") or stored.get("measured_at") or "earlier"
    return {**cuda, "measured_at": when, "kept": f"measured {str(when)[:10]} on {cuda['device']}; this run had no CUDA"}


def _cuda_target(row: dict[str, Any]) -> str | None:
    """Rows measured before the baseline and the target existed (their measured_gb counts what an earlier stage
    of the process held) have none."""
    return f"{1 - CUDA_TOLERANCE:g}-{1 + CUDA_TOLERANCE:g}" if "target_met" in row else None


def _cuda_figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    if "skipped" in r:
        return [{"figure": "memory estimate vs CUDA peak, gpt2_124m/350m on one GPU", "value": None,
                 "baseline": "torch.cuda.max_memory_allocated", "skipped": r["skipped"]}]
    return [{"figure": f"memory estimate, {x['model']} {x['precision']}"
                       f"{' activation checkpointing' if x['activation_checkpointing'] else ''}",
             "value": round(x["ratio"], 4), "baseline": f"torch.cuda.max_memory_allocated ({r['device']})",
             "target": _cuda_target(x), "met": x.get("target_met"),
             "detail": f"{x['estimated_gb']:.2f} GB vs {x['measured_gb']:.2f} GB"
                                                     + (f" ({r['kept']})" if "kept" in r else "")}
            for x in r["rows"]]


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    if "cuda" not in r:  # stored before the CPU part existed: the CUDA measurement alone
        return _cuda_figures(r)
    return [*(_cpu_figure(x) for x in r["rows"]), *_cuda_figures(r["cuda"])]


def _cuda_report(r: dict[str, Any]) -> list[str]:
    if "skipped" in r:
        return [f"memory estimate vs CUDA peak: skipped ({r['skipped']})"]
    kept = f" ({r['kept']})" if "kept" in r else ""
    lines = [f"memory estimate vs torch.cuda.max_memory_allocated on {r['device']}{kept}:"]
    for x in r["rows"]:
        verdict = "" if "target_met" not in x else f" (target within {CUDA_TOLERANCE:.0%}: " + (
            "met)" if x["target_met"] else "MISSED)")
        lines.append(f"  {x['model']} {x['precision']} ac={x['activation_checkpointing']}: estimate "
                     f"{x['estimated_gb']:.2f} GB, measured {x['measured_gb']:.2f} GB, ratio {x['ratio']:.2f}{verdict}")
    return lines


def report(result: dict[str, Any]) -> str:
    if "cuda" not in result:
        return "\n".join(_cuda_report(result))
    lines = [f"memory estimate vs what each of {result['world_size']} CPU ranks holds ({' '.join(result['config'])}; "
             f"{result['seconds']:.0f} s), estimate / measured:"]
    for x in result["rows"]:
        verdict = ("" if x["tolerance"] is None else
                   f" (target within {x['tolerance']:.0%}: {'met' if x['target_met'] else 'MISSED'})")
        measured = ", ".join(f"{b / 2**20:.3f}" for b in x["measured_bytes_per_rank"])
        lines.append(f"  {x['run']:<24} {x['component']:<11} estimate {x['estimated_bytes'] / 2**20:7.3f} MiB, "
                     f"measured {measured} MiB: {x['ratio']:.3f}{verdict}")
    return "\n".join([*lines, *_cuda_report(result["cuda"])])
