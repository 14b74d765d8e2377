"""strategy.grad_compression: the dtype (or low-rank form) gradients travel in when the data-parallel ranks average
them. Pure; no torch. The launch refuses what a strategy can't honour (one line naming the fix) and the plan says
what `auto` became; the ranks resolve it the same way (train/strategies/grad_compression.py does it).

    none      fp32 (the gradients' own dtype) on the wire
    bf16      DDP: torch's bf16_compress_hook; FSDP2 (fsdp, fsdp_grad_op, hsdp): reduce_dtype=bfloat16, for the
              reduce-scatter and, under hsdp, the all-reduce across replicas
    fp16      the same in float16 (10 mantissa bits, but a range that unscaled gradients fall out of)
    powersgd  DDP only: PowerSGD's rank-`strategy.powersgd_rank` approximation with error feedback
    auto      (the default) the run's compute dtype, bf16 or fp16, when a bf16/fp16/fp8 run averages gradients across
              nodes; none otherwise (the reasons are AUTO_WHY's)

Why `auto` and not always fp16 (the seed's wish): halving the bytes pays where the network is the bottleneck, across
nodes; within a node (NVLink, or a CPU's loopback) it saves little and costs a cast. An fp32 run asked for full
precision, and its gradients, unscaled, reach fp16's subnormals (below 6e-5) once divided by the world size: fp16
would flush them, bf16 would round every one to 8 bits. A bf16 or fp8 run already computes its gradients through
bf16 matmuls, and an fp16 run's are loss-scaled into fp16's range by its scaler: both lose nothing they had.
"""

from __future__ import annotations

from typing import Any

CHOICES = ("auto", "none", "bf16", "fp16", "powersgd")
# Strategies whose gradients FSDP2 reduces (reduce_dtype), and the one that takes DDP's communication hooks.
FSDP2 = ("fsdp", "fsdp_grad_op", "hsdp")
DDP = "ddp"
AUTO_WHY = {
    "fp32": "an fp32 run keeps its gradients in fp32 on the wire",
    "one_node": "within one node compression saves little bandwidth",
    "deepspeed": "DeepSpeed reduces in its own dtype",
    "single": "strategy=single has no gradient all-reduce",
}
# The compute dtypes that compression follows under `auto`: precision.name -> grad_compression.
AUTO_DTYPE = {"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}


def resolve(strategy: Any, precision_name: str, nodes: int) -> tuple[str, str]:
    """What strategy.grad_compression means for this run, and why (for `auto`; else "")."""
    chosen = str(strategy.get("grad_compression", "auto"))
    if chosen != "auto":
        return chosen, ""
    if strategy.get("backend") == "deepspeed":
        return "none", AUTO_WHY["deepspeed"]
    if strategy.name == "single":
        return "none", AUTO_WHY["single"]
    if precision_name not in AUTO_DTYPE:
        return "none", AUTO_WHY["fp32"]
    if nodes <= 1:
        return "none", AUTO_WHY["one_node"]
    return AUTO_DTYPE[precision_name], f"a {precision_name} run averaging gradients across {nodes} nodes"


def refusal(strategy: Any) -> str | None:
    """Why strategy.grad_compression can't be honoured by this strategy (one line naming the fix), or None."""
    chosen = str(strategy.get("grad_compression", "auto"))
    name = strategy.name
    if chosen not in CHOICES:
        return f"strategy.grad_compression={chosen} is unknown: choose one of {', '.join(CHOICES)}"
    if chosen in ("auto", "none"):
        return None
    if strategy.get("backend") == "deepspeed":
        return (f"strategy.grad_compression={chosen} can't be applied under strategy={name}: DeepSpeed reduces "
                "gradients in its own dtype (with precision=bf16 they are bf16 already): drop it, or use strategy=ddp, "
                "fsdp or hsdp")
    if name == "single":
        return f"strategy.grad_compression={chosen} compresses the gradient all-reduce, and strategy=single has none: drop it"
    if chosen == "powersgd" and name != DDP:
        return (f"strategy.grad_compression=powersgd runs as DDP's communication hook, and strategy={name} reduces "
                "through FSDP2: use strategy=ddp, or strategy.grad_compression=bf16 (FSDP2's reduce dtype)")
    return None


def plan_lines(cfg: Any, replicas: int, nodes: int) -> tuple[str, ...]:
    """The plan's line on how gradients travel, where data-parallel ranks average them (none otherwise)."""
    s = cfg.strategy
    if replicas <= 1 or s.name in ("single", "auto"):
        return ()
    kind, why = resolve(s, str(cfg.precision.name), nodes)
    wire = {"none": "uncompressed (in their own dtype)", "bf16": "in bf16 (half the bytes)",
            "fp16": "in fp16 (half the bytes)",
            "powersgd": f"as PowerSGD rank-{s.get('powersgd_rank', 4)} factors (error feedback saved per rank)"}[kind]
    setting = f"strategy.grad_compression={s.get('grad_compression', 'auto')}"
    groups = int((cfg.get("parallel") or {}).get("replica_groups", 1) or 1)
    if groups > 1:  # within a group as set; the cross-group average (train/replicas/averaging.py) in their own dtype
        across = f"across the {groups} replica groups in their own dtype (the groups' average is never compressed)"
        if replicas // groups <= 1:
            return (f"gradients averaged {across}: {setting} has nothing to compress (one data-parallel rank per group)",)
        return (f"gradients averaged over each group's {replicas // groups} data-parallel ranks {wire}: {setting}"
                + (f", {why}" if why else "") + f"; then {across}",)
    return (f"gradients averaged over {replicas} data-parallel ranks {wire}: {setting}" + (f", {why}" if why else ""),)
