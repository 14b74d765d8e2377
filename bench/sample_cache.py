"""What the key/value cache saves when sampling (issue 30, acceptance 6): greedy generation of NEW_TOKENS new tokens
after a PROMPT-token prompt by a gpt2_124m-shaped model (conf/model/gpt2_124m.yaml: 12 layers, d_model 768, 50,304
ids, 1,024 positions; random weights: the cost does not depend on them) on this CPU, through launcher.sample's own
generation (train/model/sample.py `generate`), with the cache (each new token run alone, its attention reading the
cached keys and values) against without it (`Sampling.cache=False`, launcher.sample --no-cache: the whole window
re-run for every token, as before). Both arms run in this one process on one thread (torch's intra-op threads set to
1), so the ratio is taken on the process's CPU time, which other work on the shared cores does not stretch as it
stretches wall time; the wall-time ratio is recorded beside it. Each arm runs once (the uncached one takes minutes)
after a short warm-up of both. The two outputs must be the same ids. Target: at least 5x.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

COMMAND = "python -m bench sample_cache"
TARGET = 5.0
PROMPT = 16
FULL = {"new_tokens": 256}
QUICK = {"new_tokens": 128}
MODEL = Path(__file__).resolve().parent.parent / "conf" / "model" / "gpt2_124m.yaml"


def timed(model: Any, prompt: list[int], new_tokens: int, cache: bool, context: int) -> tuple[list[int], float, float]:
    """The generated ids, CPU seconds and wall seconds of one greedy generation."""
    from train.model.sample import Sampling, generate

    wall, cpu = time.perf_counter(), time.process_time()
    ids = generate(model, prompt, Sampling(new_tokens, cache=cache), context)
    return ids, time.process_time() - cpu, time.perf_counter() - wall


def run(quick: bool = False) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf

    from contract.config.training import ModelConfig
    from train.model.build import build_model

    torch.set_num_threads(1)
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(MODEL))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    context = int(cfg.max_seq_len)
    prompt = torch.randint(0, int(cfg.vocab_size), (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    new_tokens = (QUICK if quick else FULL)["new_tokens"]
    for cache in (True, False):  # warm-up: allocator, kernels
        timed(model, prompt, 2, cache, context)
    cached, cached_cpu, cached_wall = timed(model, prompt, new_tokens, True, context)
    full, full_cpu, full_wall = timed(model, prompt, new_tokens, False, context)
    ratio = full_cpu / cached_cpu
    identical = cached == full
    return {"command": COMMAND, "quick": quick, "model": "gpt2_124m", "parameters": sum(p.numel() for p in
                                                                                       model.parameters()),
            "prompt_tokens": PROMPT, "new_tokens": new_tokens, "threads": 1,
            "cached_cpu_s": round(cached_cpu, 3), "uncached_cpu_s": round(full_cpu, 3),
            "cached_wall_s": round(cached_wall, 3), "uncached_wall_s": round(full_wall, 3),
            "ms_per_token_cached": round(1000 * cached_cpu / new_tokens, 2),
            "ms_per_token_uncached": round(1000 * full_cpu / new_tokens, 2),
            "speedup_cpu": round(ratio, 3), "speedup_wall": round(full_wall / cached_wall, 3),
            "identical": identical, "target": TARGET, "target_met": identical and ratio >= TARGET}


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"figure": f"greedy sampling, {r['new_tokens']} new tokens, {r['model']}-shaped on CPU: uncached / cached "
                       "CPU time", "value": r["speedup_cpu"], "baseline": "the whole window re-run per token",
             "target": f">= {TARGET:g}x", "met": r["target_met"],
             "detail": f"{r['ms_per_token_cached']:.1f} ms/token with the cache, {r['ms_per_token_uncached']:.1f} "
                       f"without; wall-time ratio {r['speedup_wall']:.2f}x; outputs "
                       f"{'identical' if r['identical'] else 'DIFFER'}"}]


def report(r: dict[str, Any]) -> str:
    return (f"sample_cache: {r['new_tokens']} new tokens after {r['prompt_tokens']}, {r['model']}-shaped "
            f"({r['parameters']:,} parameters), one CPU thread: cached {r['cached_cpu_s']:.1f} s CPU "
            f"({r['ms_per_token_cached']:.1f} ms/token), uncached {r['uncached_cpu_s']:.1f} s CPU "
            f"({r['ms_per_token_uncached']:.1f} ms/token): {r['speedup_cpu']:.2f}x (wall {r['speedup_wall']:.2f}x); "
            f"outputs {'identical' if r['identical'] else 'DIFFER'} (target >= {TARGET:g}x, identical: "
            f"{'met' if r['target_met'] else 'MISSED'})")
