"""The step's speed options in one line, for the plan and rank 0's log alike: what torch.compile compiles
(strategy.compile, strategy.compile_unit), whether CUDA graphs replay it (strategy.cuda_graphs), and when Python's
garbage collector runs (trainer.gc_every, train/gc_control.py). What each does on a GPU, measured: docs/strategies.md
"What to expect on a GPU"."""

from __future__ import annotations

from typing import Any

GC_EVERY_DEFAULT = 50  # contract/config/training.py TrainerConfig.gc_every (a config.yaml from before the key)


def step_line(cfg: Any) -> str:
    """`step: ...` as the plan prints it and rank 0 logs it at start."""
    s, t = cfg.strategy, cfg.trainer
    compiled, unit = bool(s.get("compile", False)), str(s.get("compile_unit", "blocks"))
    graphs = bool(s.get("cuda_graphs", False))
    if not compiled:
        what = "eager, nothing compiled (strategy.compile=false)"
    elif unit == "model":
        what = "the whole model compiled as one graph (strategy.compile=true, strategy.compile_unit=model)"
    else:
        what = "each block compiled by torch.compile (strategy.compile=true, strategy.compile_unit=blocks)"
    what += ", replayed as CUDA graphs (strategy.cuda_graphs=true)" if graphs else ""
    every = int(t.get("gc_every", GC_EVERY_DEFAULT))
    gc = (f"garbage collection every {every} steps, frozen after set-up, automatic collection off "
          f"(trainer.gc_every={every})" if every > 0 else "Python's automatic garbage collection (trainer.gc_every=0)")
    return f"step: {what}; {gc}"
