"""strategy.compile's unit (each block, or the whole model) and strategy.cuda_graphs: what each needs, checked at
launch (one line naming the fix) and again on the ranks. Pure; no torch.

A compiled block is what FSDP shards and what every strategy can take (torchtitan's habit). The whole model in one
graph lets the compiler fuse across blocks and the loss's head, where no wrapper stands between blocks: one process
(single) or DDP, whose buckets the compiler splits the graph at. CUDA graphs (torch.compile's reduce-overhead
mode) replay each compiled region's kernels with one launch, which only a static step allows: the same shapes, the
same memory addresses, no collective inside the region.
"""

from __future__ import annotations

from typing import Any

UNITS = ("blocks", "model")
# Strategies that take the whole model compiled as one graph.
WHOLE_MODEL = ("single", "ddp")
# Strategies whose step is static enough for CUDA graphs, and why the others are not.
GRAPHED = ("single", "ddp")
NOT_STATIC = {
    "fsdp": "FSDP2 all-gathers each block's parameters into fresh memory every step, and a graph replays fixed "
            "addresses",
    "deepspeed": "DeepSpeed's engine runs its own hooks and buffers inside the step",
    "pp": "a pipeline schedule sends and receives activations between stages inside the step",
    "tp": "tensor parallelism's collectives run inside each block",
    "document_mask": "each batch's document boundaries build a new attention mask, so no two steps are alike",
}


def compile_refusal(cfg: Any, on_gpus: bool) -> str | None:
    """Why strategy.compile_unit or strategy.cuda_graphs can't be honoured for this config, or None."""
    s, p = cfg.strategy, cfg.get("parallel")
    unit, graphs, compiled = str(s.get("compile_unit", "blocks")), bool(s.get("cuda_graphs", False)), bool(s.compile)
    pp, tp = (int(p.pp), int(p.tp)) if p is not None else (1, 1)
    if unit == "model" and not compiled:
        return "strategy.compile_unit=model says what strategy.compile compiles: add strategy.compile=true"
    if unit == "model" and (s.name not in WHOLE_MODEL or pp > 1 or tp > 1):
        what = f"parallel.pp={pp}" if pp > 1 else f"parallel.tp={tp}" if tp > 1 else f"strategy={s.name}"
        return (f"strategy.compile_unit=model compiles the model as one graph, and {what} wraps or splits it between "
                f"blocks: use strategy.compile_unit=blocks (or strategy=ddp)")
    if compiled and tp > 1 and not on_gpus:
        return (f"strategy.compile=true with parallel.tp={tp} on CPU ranks trains to wrong gradients (torch.compile of "
                "tensor-parallel blocks over gloo: the gradient norm 27% off at step 1, measured with torch 2.13): "
                "drop strategy.compile, or use parallel.tp=1")
    if not graphs:
        return None
    if not compiled:
        return ("strategy.cuda_graphs=true replays what torch.compile compiled (its reduce-overhead mode): add "
                "strategy.compile=true")
    if not on_gpus:
        return "strategy.cuda_graphs=true needs the ranks on NVIDIA GPUs, and these run on CPUs: drop it"
    why = (NOT_STATIC["pp"] if pp > 1 else NOT_STATIC["tp"] if tp > 1
           else NOT_STATIC["deepspeed"] if s.get("backend") == "deepspeed"
           else NOT_STATIC["fsdp"] if s.name not in GRAPHED
           else NOT_STATIC["document_mask"] if cfg.data.get("document_mask", False) else None)
    if why:
        return f"strategy.cuda_graphs=true needs a static step, and here {why}: drop strategy.cuda_graphs"
    return None


def compile_mode(strategy: Any) -> str | None:
    """torch.compile's mode: reduce-overhead (CUDA graphs) with strategy.cuda_graphs, else the default."""
    return "reduce-overhead" if bool(strategy.get("cuda_graphs", False)) else None
