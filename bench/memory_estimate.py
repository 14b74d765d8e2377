"""The launch plan's memory estimate against the CUDA allocator's peak, on one GPU (skipped without CUDA).

For gpt2_124m and gpt2_350m (strategy=single, fp32 and bf16, with and without activation checkpointing): the
estimate without its margin (the margin stands for the CUDA context and fragmentation, which the allocator's count
does not include) against `torch.cuda.max_memory_allocated` over three optimizer steps of the real loop. Reported
as estimate / measured; the CPU counterpart (states and saved activations) is tests/dist/test_memory_estimate.py
and tests/unit/test_estimate.py.
"""

from __future__ import annotations

import os
from typing import Any

CASES = [(model, precision, ac) for model in ("gpt2_124m", "gpt2_350m") for precision in ("fp32", "bf16")
         for ac in (False, True)]
COMMON = ["strategy=single", "local.nproc=1", "logger.backend=none", "trainer.micro_batch_size=8",
          "data.seq_len=1024", "launcher.force=true"]


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA", "target_met": True, "command": "python -m bench memory_estimate"}
    from launcher.compose import compose_and_plan
    from train import distributed
    from train.data import build_source
    from train.loop import TrainState, seed_everything, train_step
    from train.model import build_model
    from train.strategies import build_strategy

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), SLURMTRAIN_LAUNCHER="local")
    env = distributed.detect()
    distributed.init_process_group(env, "nccl")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # initialise the allocator before reading its statistics
    rows = []
    try:
        for model_name, precision, ac in [c for c in CASES if not quick or c[0] == "gpt2_124m"]:
            cfg, plan = compose_and_plan([f"model={model_name}", f"precision={precision}",
                                          f"strategy.activation_checkpointing={str(ac).lower()}", *COMMON])
            assert plan.fit is not None
            est = plan.fit.estimate
            seed_everything(0)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            strategy = build_strategy(cfg, env, device)
            model = strategy.setup(build_model(cfg.model))
            source = build_source(cfg.data, cfg.model.vocab_size)
            state = TrainState()
            for _ in range(3):
                train_step(model, strategy, source, state, cfg, env, device)
                strategy.optimizer_step()
                state.samples += cfg.trainer.global_batch_size
            torch.cuda.synchronize(device)
            measured = torch.cuda.max_memory_allocated(device)
            estimated = est.total - est.margin
            rows.append({"model": model_name, "precision": precision, "activation_checkpointing": ac,
                         "estimated_gb": estimated / 2**30, "measured_gb": measured / 2**30,
                         "ratio": estimated / measured, "estimate": est.as_gb()})
            del strategy, model
            torch.cuda.empty_cache()
    finally:
        distributed.destroy_process_group()
    worst = max(abs(r["ratio"] - 1) for r in rows)
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
            "worst_relative_error": worst, "target_met": True, "quick": quick,
            "command": "python -m bench memory_estimate"}


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"figure": f"memory estimate, {x['model']} {x['precision']}"
                       f"{' activation checkpointing' if x['activation_checkpointing'] else ''}",
             "value": round(x["ratio"], 4), "baseline": f"torch.cuda.max_memory_allocated ({r['device']})",
             "target": None, "met": None, "detail": f"{x['estimated_gb']:.2f} GB vs {x['measured_gb']:.2f} GB"}
            for x in r["rows"]]


def report(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"memory estimate vs CUDA peak: skipped ({result['skipped']})"
    lines = [f"memory estimate vs torch.cuda.max_memory_allocated on {result['device']}:"]
    for r in result["rows"]:
        lines.append(f"  {r['model']} {r['precision']} ac={r['activation_checkpointing']}: estimate "
                     f"{r['estimated_gb']:.2f} GB, measured {r['measured_gb']:.2f} GB, ratio {r['ratio']:.2f}")
    return "\n".join(lines)
