"""loop_overhead's GPU arm (issue 35 item 5), on one GPU: tokens/s and MFU of our loop against a bare PyTorch loop
on the same GPU, and the host-device synchronisations of our steady steps.

Rows: gpt2_124m at micro batch 8, gpt2_350m at 8 and 16, llama3_1b at 8 in bf16 and in fp8 (torchao float8 linear
layers in both loops, those too small to pay left in bf16 by torchao's size rule), and Llama 3 8B's width with 4
layers in bf16 and fp8, seq_len 1024, each block compiled. The bare loop is bench/bare_loop.py's `bare` (the same
model, compiled and converted alike, one micro batch in memory, the plain loss). Ours is train() as one rank runs it.

Syncs: our timed run goes under `torch.cuda.set_sync_debug_mode("warn")`, which warns at every synchronising CUDA
call (a scalar read, a blocking copy to the host, an event wait, `nonzero`); the warnings are counted by the step
the loop is in (SyncCounter). Steady steps are those neither a log step nor the step after one (a value read a step
late), nor the first two or the last; their mean count is the figure (target 0). train/observe/sync_count.py, the
counter of branch `sync`, was not on main when this was written: this one needs nothing from the loop.

MFU: against the GPU's dense bf16 peak for every row (torchtitan's convention, comparable across rows); fp8 rows
also against the mix of fp8 and bf16 peaks their FLOPs run at (contract/rules/float8.py effective_peak).
"""

from __future__ import annotations

import statistics
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bare_loop import LOG_EVERY, bare

# In the order they matter (a run cut short by make gpu-check's time budget keeps the first rows).
GPU_CASES = {
    "gpt2_350m mb8": ["model=gpt2_350m", "precision=bf16"],
    "llama3_1b mb8": ["model=llama3_1b", "precision=bf16"],
    "llama3_1b mb8 fp8": ["model=llama3_1b", "precision=fp8"],
    # Llama 3 8B's width (d_model 4096, 32 heads, 8 kv heads, ffn 14336, 128k vocabulary) with 4 of its 32 layers, to
    # fit one GPU: where torchao publishes float8's speedup (+25% tensorwise with FSDP2's float8 all-gather, 8 H100s).
    # One GPU has no all-gather to save: this row measures the matmuls alone.
    "llama3_8b_w4l mb8": ["model=llama3_8b", "model.n_layers=4", "precision=bf16"],
    "llama3_8b_w4l mb8 fp8": ["model=llama3_8b", "model.n_layers=4", "precision=fp8"],
    "gpt2_350m mb16": ["model=gpt2_350m", "precision=bf16", "trainer.micro_batch_size=16"],
    "gpt2_124m mb8": ["model=gpt2_124m", "precision=bf16"],
}
GPU_COMMON = ["strategy=ddp", "strategy.compile=true", "data.seq_len=1024", "trainer.micro_batch_size=8",
              "local.nproc=1", "logger.backend=none", "trainer.ckpt_every=0", f"trainer.log_every={LOG_EVERY}",
              "trainer.progress_bar=false", "eval.every=0"]
GPU_TARGET = 1.00
MFU_TARGETS = {"llama3_1b mb8": 0.50, "gpt2_350m mb16": 0.48}
# fp8 / bf16 tokens/s: 1.10 at llama3_1b's width (torchao's tables put rowwise near break-even at d_model 2048),
# 1.25 at 8B's (torchao's published tensorwise figure).
FP8_SPEEDUP_TARGETS = {"llama3_1b mb8": 1.10, "llama3_8b_w4l mb8": 1.25}
# (steps per run, pairs): quick is what make gpu-check runs (5 rows, 10 compiled runs, under 8 minutes on an H200).
GPU_PLAN = {"full": (60, 3), "quick": (30, 1)}
# Dense peaks (TFLOP/s) of the GPUs we know, for MFU.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
PEAK_FP8_TFLOPS = {"H100": 1978.9, "H200": 1978.9, "L40S": 733.0}


class SyncCounter:
    """Synchronising CUDA calls of train() by the step the loop is in: set_sync_debug_mode("warn")'s warnings,
    counted instead of printed, and the step read off train.loop.train_step's state as each step starts."""

    def __init__(self) -> None:
        self.step = 0
        self.by_step: Counter[int] = Counter()

    def __enter__(self) -> SyncCounter:
        import torch

        import train.loop as loop

        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if "synchroniz" in str(message):
                self.by_step[self.step] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        self._step_fn = loop.train_step

        def counted_step(model: Any, strategy: Any, source: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
            self.step = state.step + 1
            return self._step_fn(model, strategy, source, state, *args, **kwargs)

        loop.train_step = counted_step  # type: ignore[assignment]
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        import train.loop as loop

        torch.cuda.set_sync_debug_mode("default")
        loop.train_step = self._step_fn  # type: ignore[assignment]
        self._warnings.__exit__(*exc)

    def per_steady_step(self, steps: int, log_every: int) -> tuple[float, list[int]]:
        """The mean count over the steady steps, and those steps."""
        steady = [s for s in range(3, steps) if s % log_every and (s - 1) % log_every]
        return sum(self.by_step[s] for s in steady) / max(1, len(steady)), steady


def _peak(table: dict[str, float], name: str) -> float | None:
    return next((tf for key, tf in table.items() if key in name), None)


def run_gpu(steps: int, pairs: int, env: Any, tmp: Path, *, deadline: float | None = None,
            on_row: Callable[[dict[str, Any]], None] | None = None, cases: list[str] | None = None) -> dict[str, Any]:
    """The rows of GPU_CASES (those named in `cases`, or all): ours against bare, alternating in pairs, on cuda:0.
    With a deadline
    (time.monotonic()), rows not started by then are left out and named under "not_run"; on_row sees the result
    after each row."""
    import time

    import torch

    from bench.telemetry_overhead import step_times
    from contract.rules.float8 import effective_peak, enabled, float8_flops_per_token
    from launcher.compose import compose_and_plan
    from train.loop import train
    from train.model.build import build_model, flops_per_token

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    name = torch.cuda.get_device_name(device)
    peak, peak_fp8 = _peak(PEAK_BF16_TFLOPS, name), _peak(PEAK_FP8_TFLOPS, name)
    out: dict[str, Any] = {"device": name, "peak_bf16_tflops": peak, "peak_fp8_tflops": peak_fp8}
    for case, overrides in GPU_CASES.items():
        if cases is not None and case not in cases:
            continue
        if deadline is not None and time.monotonic() > deadline:
            out.setdefault("not_run", []).append(case)
            continue
        config = [*GPU_COMMON, *overrides, f"trainer.max_steps={steps}"]
        cfg, _ = compose_and_plan(config)
        flops, _ = flops_per_token(build_model(cfg.model), cfg.model, cfg.data.seq_len)
        tokens_per_step = cfg.trainer.micro_batch_size * cfg.trainer.grad_accum_steps * cfg.data.seq_len
        times: dict[str, list[float]] = {"ours": [], "bare": []}
        syncs: list[float] = []
        for pair in range(pairs):
            for arm in (["ours", "bare"] if pair % 2 == 0 else ["bare", "ours"]):
                if arm == "bare":
                    times[arm].append(bare(cfg, steps, device=device))
                else:
                    run_dir = tmp / f"gpu_{case.replace(' ', '_')}_{pair}"
                    run_dir.mkdir(parents=True)
                    with SyncCounter() as counter:
                        train(cfg, env, device, run_dir)
                    syncs.append(counter.per_steady_step(steps, LOG_EVERY)[0])
                    times[arm].append(statistics.median(step_times(run_dir / "metrics.jsonl", LOG_EVERY)))
                torch.cuda.empty_cache()
        ratios = [b / a for a, b in zip(times["ours"], times["bare"], strict=True)]  # tokens/s ours / bare
        ratio = statistics.median(ratios)
        tps = {arm: tokens_per_step / statistics.median(v) for arm, v in times.items()}
        row: dict[str, Any] = {
            "tokens_per_s_ours": round(tps["ours"], 1), "tokens_per_s_bare": round(tps["bare"], 1),
            "ratio": round(ratio, 4), "pair_ratios": [round(r, 4) for r in ratios],
            "mfu_ours": None if peak is None else round(tps["ours"] * flops / (peak * 1e12), 4),
            "mfu_bare": None if peak is None else round(tps["bare"] * flops / (peak * 1e12), 4),
            "syncs_per_steady_step": round(statistics.mean(syncs), 3),
            "target_ratio": GPU_TARGET, "target_met": ratio >= GPU_TARGET, "steps_per_run": steps, "pairs": pairs,
            "config": config}
        if case in MFU_TARGETS:
            row["target_mfu"] = MFU_TARGETS[case]
        if enabled(cfg.precision) and peak and peak_fp8:
            mixed = effective_peak(flops, float8_flops_per_token(cfg.model, cfg.precision), peak_fp8, peak)
            row["mfu_ours_mixed_peak"] = round(tps["ours"] * flops / (mixed * 1e12), 4)
        out[case] = row
        if on_row is not None:
            on_row(out)
    for case, target in FP8_SPEEDUP_TARGETS.items():
        bf16, fp8 = out.get(case), out.get(f"{case} fp8")
        if bf16 and fp8:
            key = "fp8_speedup" if case == "llama3_1b mb8" else f"fp8_speedup {case}"
            out[key] = {"value": round(fp8["tokens_per_s_ours"] / bf16["tokens_per_s_ours"], 4), "target": target,
                        "case": case}
    return out


def gpu_rows(gpu: dict[str, Any]) -> dict[str, Any]:
    """The per-case rows of a GPU result (leaving out device, peaks and the fp8 speedup)."""
    return {k: v for k, v in gpu.items() if isinstance(v, dict) and "ratio" in v}


def report_lines(gpu: dict[str, Any]) -> list[str]:
    if "skipped" in gpu:
        return [f"  GPU ({', '.join(GPU_CASES)}): skipped ({gpu['skipped']})"]
    lines = []
    for name, c in gpu_rows(gpu).items():
        verdict = "met" if c["target_met"] else "MISSED"
        mfu = "" if c["mfu_ours"] is None else f"; MFU {c['mfu_ours']:.1%} vs {c['mfu_bare']:.1%}"
        if "mfu_ours_mixed_peak" in c:
            mfu += f" ({c['mfu_ours_mixed_peak']:.1%} of the fp8/bf16 mixed peak)"
        lines.append(f"  {name} on {gpu['device']}: {c['tokens_per_s_ours']:.0f} vs {c['tokens_per_s_bare']:.0f} "
                     f"tokens/s = {c['ratio']:.3f}x (target >= {c['target_ratio']}: {verdict}){mfu}; "
                     f"{c['syncs_per_steady_step']:g} syncs per steady step")
    if gpu.get("not_run"):
        lines.append(f"  not run (make gpu-check's time budget): {', '.join(gpu['not_run'])}")
    for key in [k for k in gpu if k.startswith("fp8_speedup")]:
        s = gpu[key]
        lines.append(f"  {s.get('case', 'llama3_1b mb8')} fp8 / bf16 tokens/s: {s['value']:.3f}x (target >= "
                     f"{s['target']})")
    return lines
