"""What our training loop costs on top of the model's own work: median step time of train.loop.train against a
bare PyTorch loop doing the same model work, measured in one run: one process, and DDP on 2 ranks.

The bare loop (bench/bare_loop.py) is what a user would write: the same model class built from the same config
(train.model.build), one fixed micro batch already in memory (no data loading at all), forward, cross-entropy,
backward with the same gradient accumulation, clip_grad_norm_, the same AdamW (train.optim.build_optimizer: same
groups and foreach kernels), zero_grad. Ours is the real loop as `python -m launcher` runs it on one rank (strategy
ddp = the bare model on one rank; synthetic data through the prefetch thread; telemetry, watchdog, metrics, the per-step stop
agreement; no periodic checkpoints). Both are timed the same way: wall time per step over intervals of LOG_EVERY
steps (ours from metrics.jsonl's tokens/s, rank 0's clock from one log step to the next), the first interval
(warm-up) dropped, the median over the intervals. Runs alternate in adjacent pairs (ours/bare, bare/ours, ...) so
that a drift of the shared machine's speed cancels, and the ratio is the median over the pairs of ours / bare.

DDP on 2 ranks (gloo, one thread each, spawned together): ours is train() with strategy=ddp on a world of 2; the
bare loop wraps the same model in a default `DistributedDataParallel` (what a user writes) and feeds each rank a
fixed micro batch of its own. The pairs alternate the same way; rank 0's clock times both.

For `tiny` a third arm runs our loop with trainer.prefetch_steps=0 (data made on the training thread, as before
background loading): the difference is what prefetching takes off the critical path. Targets (issue 13): at most
1.10x for tiny, 1.03x for the >= 20M-parameter model.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.bare_loop import LOG_EVERY, bare, init_single_process

COMMAND = "python -m bench loop_overhead"
COMMON = ["local.nproc=1", "logger.backend=none", "trainer.ckpt_every=0", f"trainer.log_every={LOG_EVERY}",
          "trainer.progress_bar=false", "data.seq_len=64"]
CASES: dict[str, dict[str, Any]] = {
    "tiny": {"overrides": ["model=tiny", "trainer.micro_batch_size=8"], "target": 1.10, "sync_arm": True},
    # GPT-2 layout, 6 layers of width 512 and a vocabulary of 8192: about 24M parameters.
    "gpt_24m": {"overrides": ["model=gpt2_124m", "model.n_layers=6", "model.d_model=512", "model.n_heads=8",
                              "model.ffn_hidden=2048", "model.vocab_size=8192", "trainer.micro_batch_size=4"],
                "target": 1.03, "sync_arm": False},
}
# (steps per run, pairs) per case; quick: CI smoke, the same cases with fewer steps and pairs.
FULL = {"tiny": (100, 6), "gpt_24m": (30, 3)}
DDP_FULL = {"tiny": (100, 5), "gpt_24m": (30, 2)}  # two ranks share the 2 cores: fewer pairs (make bench < 15 min)
QUICK = {"tiny": (40, 2), "gpt_24m": (30, 1)}
DDP_WORLD = 2


def ours(cfg: Any, env: Any, run_dir: Path) -> float:
    """Median wall time per step of the real loop (s)."""
    import torch

    from bench.telemetry_overhead import step_times
    from train.loop import train

    run_dir.mkdir(parents=True)
    train(cfg, env, torch.device("cpu"), run_dir)
    return statistics.median(step_times(run_dir / "metrics.jsonl", LOG_EVERY))


def run_case(name: str, steps: int, pairs: int, env: Any, tmp: Path) -> dict[str, Any]:
    from launcher.compose import compose_and_plan
    from train.model.build import build_model

    case = CASES[name]
    overrides = [*COMMON, *case["overrides"], f"trainer.max_steps={steps}"]
    cfg, _ = compose_and_plan(overrides)
    sync_cfg, _ = compose_and_plan([*overrides, "trainer.prefetch_steps=0"])
    n_params = sum(p.numel() for p in build_model(cfg.model).parameters())
    times: dict[str, list[float]] = {"ours": [], "bare": [], "ours_no_prefetch": []}
    for pair in range(pairs):
        arms = ["ours", "bare"] if pair % 2 == 0 else ["bare", "ours"]
        if case["sync_arm"]:
            arms.append("ours_no_prefetch")
        for arm in arms:
            run_dir = tmp / f"{name}_{arm}_{pair}"
            if arm == "bare":
                times[arm].append(bare(cfg, steps))
            else:
                times[arm].append(ours(cfg if arm == "ours" else sync_cfg, env, run_dir))
    ratios = [a / b for a, b in zip(times["ours"], times["bare"], strict=True)]
    ratio = statistics.median(ratios)
    out: dict[str, Any] = {
        "config": overrides, "params_m": round(n_params / 1e6, 2), "steps_per_run": steps, "pairs": pairs,
        "step_ms_ours": round(statistics.median(times["ours"]) * 1000, 3),
        "step_ms_bare": round(statistics.median(times["bare"]) * 1000, 3),
        "ratio": round(ratio, 4), "pair_ratios": [round(r, 4) for r in ratios],
        "target_ratio": case["target"], "target_met": ratio <= case["target"],
        "step_ms_ours_all": [round(x * 1000, 3) for x in times["ours"]],
        "step_ms_bare_all": [round(x * 1000, 3) for x in times["bare"]],
    }
    if times["ours_no_prefetch"]:
        sync_ratios = [a / b for a, b in zip(times["ours_no_prefetch"], times["bare"], strict=True)]
        out["step_ms_ours_no_prefetch"] = round(statistics.median(times["ours_no_prefetch"]) * 1000, 3)
        out["ratio_no_prefetch"] = round(statistics.median(sync_ratios), 4)
    return out


def join_gloo(rank: int, world: int, port: int) -> Any:
    """A spawned benchmark rank joins a gloo group of `world` on this host, one thread; returns its DistEnv."""
    import torch

    from train import distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURMTRAIN_LAUNCHER="local")
    torch.set_num_threads(1)
    env = distributed.detect()
    distributed.init_process_group(env, "gloo")
    return env


def _ddp_worker(rank: int, world: int, port: int, out_dir: str, plan: dict[str, tuple[int, int]]) -> None:
    """One of DDP_WORLD ranks: for each case, pairs of (ours, bare) in alternating order; rank 0 writes the times."""
    import torch

    from launcher.compose import compose_and_plan
    from train import distributed
    from train.loop import train

    env = join_gloo(rank, world, port)
    times: dict[str, dict[str, list[float]]] = {}
    try:
        for name, (steps, pairs) in plan.items():
            overrides = [*COMMON, *CASES[name]["overrides"], f"local.nproc={world}", "strategy=ddp",
                         f"trainer.max_steps={steps}"]
            cfg, _ = compose_and_plan(overrides)
            times[name] = {"ours": [], "bare": []}
            for pair in range(pairs):
                for arm in (["ours", "bare"] if pair % 2 == 0 else ["bare", "ours"]):
                    if arm == "bare":
                        times[name][arm].append(bare(cfg, steps, rank, world))
                    else:
                        run_dir = Path(out_dir) / f"ddp_{name}_{pair}"
                        if rank == 0:
                            run_dir.mkdir(parents=True)
                        torch.distributed.barrier()  # rank 0 made the run directory
                        train(cfg, env, torch.device("cpu"), run_dir)
                        if rank == 0:
                            from bench.telemetry_overhead import step_times

                            times[name][arm].append(statistics.median(step_times(run_dir / "metrics.jsonl",
                                                                                 LOG_EVERY)))
        if rank == 0:
            (Path(out_dir) / "ddp_times.json").write_text(json.dumps(times))
    finally:
        distributed.destroy_process_group()


def run_ddp(plan: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Every case on DDP_WORLD ranks: ratio ours / bare DDP, the median over the adjacent pairs."""
    import torch.multiprocessing as mp

    from bench.ports import hosted_port

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_worker, args=(DDP_WORLD, hosted_port(DDP_WORLD), tmp, plan), nprocs=DDP_WORLD)
        times = json.loads((Path(tmp) / "ddp_times.json").read_text())
    out = {}
    for name, t in times.items():
        ratios = [a / b for a, b in zip(t["ours"], t["bare"], strict=True)]
        ratio = statistics.median(ratios)
        target = CASES[name]["target"]
        out[name] = {"world_size": DDP_WORLD, "steps_per_run": plan[name][0], "pairs": plan[name][1],
                     "step_ms_ours": round(statistics.median(t["ours"]) * 1000, 3),
                     "step_ms_bare": round(statistics.median(t["bare"]) * 1000, 3),
                     "ratio": round(ratio, 4), "pair_ratios": [round(r, 4) for r in ratios],
                     "target_ratio": target, "target_met": ratio <= target}
    return out


PROFILE_STEPS, PROFILE_TOP = 100, 12


def profile_ours(name: str, env: Any, tmp: Path) -> dict[str, Any]:
    """Where our loop's time goes on this case: one run of train() under cProfile (the training thread), the
    functions with the most own time, and the share of the whole run spent outside torch's kernels."""
    import cProfile
    import pstats

    import torch

    from launcher.compose import compose_and_plan
    from train.loop import train

    cfg, _ = compose_and_plan([*COMMON, *CASES[name]["overrides"], f"trainer.max_steps={PROFILE_STEPS}"])
    run_dir = tmp / f"profile_{name}"
    run_dir.mkdir(parents=True)
    profiler = cProfile.Profile()
    profiler.enable()
    train(cfg, env, torch.device("cpu"), run_dir)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (path, line, func), (_, calls, own, cum, _) in sorted(stats.stats.items(),  # type: ignore[attr-defined]
                                                               key=lambda kv: -kv[1][2])[:PROFILE_TOP]:
        where = func if path == "~" else f"{Path(path).parent.name}/{Path(path).name}:{line}({func})"
        rows.append({"function": where, "calls": calls, "own_s": round(own, 4), "cumulative_s": round(cum, 4),
                     "share": round(own / total, 4)})
    return {"case": name, "steps": PROFILE_STEPS, "total_s": round(total, 3), "top": rows}


def notes(r: dict[str, Any]) -> str:
    """REPORT.md's section: where our loop's time goes (the profile), and what limits the figures."""
    p = r.get("profile")
    if not p:
        return ""
    lines = [f"Where our loop's time goes: `{p['case']}`, {p['steps']} steps of the real loop under cProfile "
             f"(training thread, {p['total_s']:.2f} s in all), the functions with the most own time:", "",
             "| function | calls | own s | share |", "| --- | --- | --- | --- |"]
    lines += [f"| `{x['function']}` | {x['calls']} | {x['own_s']:.3f} | {x['share']:.1%} |" for x in p["top"]]
    tiny = r["cases"].get("tiny", {})
    if "ratio_no_prefetch" in tiny:
        lines += ["", f"What limits `tiny` on this machine: the step is {tiny['step_ms_bare']:.1f} ms of Python-dispatched "
                  f"CPU kernels; our loop without background loading costs {tiny['ratio_no_prefetch']:.3f}x the bare "
                  f"loop, with it {tiny['ratio']:.3f}x. The prefetch thread shares the GIL with the training "
                  "thread, so on a CPU-only rank the data it prepares is not free; on a GPU the training thread "
                  "mostly waits for kernels and the copy is pinned and asynchronous. Pairs of runs differ by up to "
                  f"{max(tiny['pair_ratios']) - min(tiny['pair_ratios']):.0%} on this shared 2-core machine."]
    return "\n".join(lines)


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    from train import distributed

    torch.set_num_threads(1)  # as every rank runs (trainer.cpu_threads=1); both loops alike
    plan = QUICK if quick else FULL
    env = init_single_process()
    gpu: dict[str, Any]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cases = {name: run_case(name, *plan[name], env, Path(tmp)) for name in CASES}
            profile = profile_ours("tiny", env, Path(tmp))
            if torch.cuda.is_available():
                from bench.loop_overhead_gpu import GPU_PLAN, run_gpu

                gpu = run_gpu(*GPU_PLAN["quick" if quick else "full"], env, Path(tmp))
            else:
                gpu = {"skipped": "no CUDA"}
    finally:
        distributed.destroy_process_group()
    ddp = run_ddp(QUICK if quick else DDP_FULL)
    return {
        "benchmark": "loop_overhead", "torch": torch.__version__, "device": "cpu", "world_size": 1,
        "log_every": LOG_EVERY, "quick": quick, "cases": cases, "profile": profile,
        "ddp_2_ranks": ddp,
        "gpu": gpu,
        "target_met": all(c["target_met"] for c in [*cases.values(), *ddp.values(), *_gpu_cases(gpu).values()]),
        "command": COMMAND + (" --quick" if quick else ""),
    }


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the report: one per case (ratio ours / bare), plus the loop without prefetching where measured."""
    rows = []
    for name, c in r["cases"].items():
        rows.append({"figure": f"loop overhead, {name} ({c['params_m']}M params), 1 process", "value": c["ratio"],
                     "baseline": "bare PyTorch loop, same model work", "target": f"<= {c['target_ratio']}x",
                     "met": c["target_met"], "detail": f"{c['step_ms_ours']:.1f} ms vs {c['step_ms_bare']:.1f} ms"})
        if "ratio_no_prefetch" in c:
            rows.append({"figure": f"loop overhead, {name}, trainer.prefetch_steps=0",
                         "value": c["ratio_no_prefetch"], "baseline": "bare PyTorch loop, same model work",
                         "target": None, "met": None,
                         "detail": f"{c['step_ms_ours_no_prefetch']:.1f} ms: data on the training thread"})
    ddp = r["ddp_2_ranks"]
    if "skipped" in ddp:  # results stored before the DDP arm existed
        rows.append({"figure": "loop overhead, ddp on 2 ranks", "value": None, "baseline": "bare PyTorch DDP loop",
                     "skipped": ddp["skipped"]})
    for name, c in ({} if "skipped" in ddp else ddp).items():
        rows.append({"figure": f"loop overhead, {name}, ddp on {c['world_size']} ranks", "value": c["ratio"],
                     "baseline": "bare PyTorch DDP loop, same model work", "target": f"<= {c['target_ratio']}x",
                     "met": c["target_met"], "detail": f"{c['step_ms_ours']:.1f} ms vs {c['step_ms_bare']:.1f} ms"})
    if "skipped" in r["gpu"]:
        rows.append({"figure": "GPU: gpt2_124m/350m, llama3_1b bf16 and fp8, compiled, tokens/s", "value": None,
                     "baseline": "bare PyTorch loop on the same GPU", "target": ">= 1.0", "skipped": r["gpu"]["skipped"]})
    for name, c in _gpu_cases(r["gpu"]).items():
        mfu = "" if c.get("mfu_ours") is None else f"; MFU {c['mfu_ours']:.1%} vs {c['mfu_bare']:.1%}"
        syncs = f"; {c['syncs_per_steady_step']:g} syncs per steady step" if "syncs_per_steady_step" in c else ""
        rows.append({"figure": f"GPU tokens/s, {name} compiled ({r['gpu']['device']})", "value": c["ratio"],
                     "baseline": "bare PyTorch loop on the same GPU", "target": f">= {c['target_ratio']}",
                     "met": c["target_met"],
                     "detail": f"{c['tokens_per_s_ours']:.0f} vs {c['tokens_per_s_bare']:.0f} tokens/s{mfu}{syncs}"})
    return rows


def _gpu_cases(gpu: dict[str, Any]) -> dict[str, Any]:
    from bench.loop_overhead_gpu import gpu_rows

    return gpu_rows(gpu)


def report(r: dict[str, Any]) -> str:
    lines = [f"loop_overhead ({'quick, ' if r['quick'] else ''}one process, median step time, ours / bare):"]
    for name, c in r["cases"].items():
        verdict = "met" if c["target_met"] else "MISSED"
        extra = (f"; without prefetching {c['step_ms_ours_no_prefetch']:.2f} ms = {c['ratio_no_prefetch']:.3f}x"
                 if "ratio_no_prefetch" in c else "")
        lines.append(f"  {name} ({c['params_m']}M params): {c['step_ms_ours']:.2f} ms vs {c['step_ms_bare']:.2f} ms "
                     f"= {c['ratio']:.3f}x (pairs {min(c['pair_ratios']):.3f}-{max(c['pair_ratios']):.3f}; target <= "
                     f"{c['target_ratio']}x: {verdict}){extra}")
    for name, c in r["ddp_2_ranks"].items() if "skipped" not in r["ddp_2_ranks"] else ():
        verdict = "met" if c["target_met"] else "MISSED"
        lines.append(f"  {name}, ddp on {c['world_size']} ranks: {c['step_ms_ours']:.2f} ms vs {c['step_ms_bare']:.2f} "
                     f"ms = {c['ratio']:.3f}x (pairs {min(c['pair_ratios']):.3f}-{max(c['pair_ratios']):.3f}; target "
                     f"<= {c['target_ratio']}x: {verdict})")
    from bench.loop_overhead_gpu import report_lines

    lines += report_lines(r["gpu"])
    return "\n".join(lines)
