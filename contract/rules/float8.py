"""precision=fp8: what it needs and what it changes, computed alike by the launch plan and the ranks.

torchao's float8 training (Float8Linear) runs the linear layers of our transformer's blocks in float8: the q, k, v
and output projections and the MLP's. The output layer (vocabulary) stays in bf16, as torchtitan leaves it:
its logits feed the loss directly and it is where float8's rounding hurts most. Everything else runs in bf16
autocast; master weights and optimizer state stay fp32. A tensorwise recipe lets FSDP2 all-gather the weights
already cast to float8 (1 byte a parameter instead of fp32's 4); rowwise scales each row on its own (more
accurate, communication in high precision).

float8 matrix multiplies need an NVIDIA GPU of compute capability 9.0 or newer (Hopper, Blackwell) and every
dimension of a converted layer divisible by 16. A layer too small for float8 to pay (its casts and scales cost more
than the faster matmul saves) stays in bf16 by torchao's own size rule for the recipe (its _auto_filter_for_recipe,
the thresholds of its per-shape tables on H100; torchtitan's auto_filter_small_kn): precision.float8_filter=auto,
the default; `all` converts every layer whose dimensions divide by 16. Pure functions; no torch.
"""

from __future__ import annotations

from typing import Any

RECIPES = ("tensorwise", "rowwise")
MIN_CAPABILITY = (9, 0)
# cluster.gpu_type prefixes of GPUs with float8 tensor cores of compute capability 9.0 or newer.
FP8_GPU_TYPES = ("h100", "h200", "h800", "h20", "gh200", "b100", "b200", "gb200", "b300", "gb300")
DIM_MULTIPLE = 16
WANTED = "precision=bf16"


def enabled(precision: Any) -> bool:
    return str(getattr(precision, "name", precision)) == "fp8"


def small_layer(in_features: int, out_features: int, recipe: str) -> str | None:
    """Why a linear layer of these features is too small for float8 to pay under `recipe`, or None (torchao's
    thresholds, K the input and N the output features)."""
    k, n = in_features, out_features
    if recipe == "rowwise":
        if n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048):
            return "rowwise: N <= 2048, K <= 1024, or N <= 4096 and K <= 2048"
        return None
    if k <= 4096 and n <= 1024:
        return "tensorwise: K <= 4096 and N <= 1024"
    return None


def _filtered(precision: Any) -> tuple[str, bool]:
    """(recipe, whether the size rule applies) of a precision section; None: tensorwise, every layer (the callers
    that have no precision section: a user's own count)."""
    if precision is None or isinstance(precision, str):
        return "tensorwise", False
    return str(precision.get("float8_recipe", "tensorwise")), str(precision.get("float8_filter", "auto")) == "auto"


def converted_shapes(m: Any, precision: Any = None) -> dict[str, tuple[int, int]]:
    """linear_shapes less the layers the size rule leaves in bf16 (precision.float8_filter=auto)."""
    recipe, rule = _filtered(precision)
    return {name: (i, o) for name, (i, o) in linear_shapes(m).items() if not (rule and small_layer(i, o, recipe))}


def kept_in_bf16(m: Any, precision: Any) -> dict[str, str]:
    """The block layers the size rule leaves in bf16, each with the rule that keeps it."""
    recipe, rule = _filtered(precision)
    if not rule:
        return {}
    return {name: why for name, (i, o) in linear_shapes(m).items() if (why := small_layer(i, o, recipe))}


def linear_shapes(m: Any) -> dict[str, tuple[int, int]]:
    """The (in, out) features of each linear layer of one block that float8 converts, by its name in the block."""
    d, heads = int(m.d_model), int(m.n_heads)
    head_dim = d // heads
    q, kv = heads * head_dim, int(m.n_kv_heads or heads) * head_dim
    shapes = {"attn.q": (d, q), "attn.k": (d, kv), "attn.v": (d, kv), "attn.out": (q, d),
              "mlp.up": (d, int(m.ffn_hidden)), "mlp.down": (int(m.ffn_hidden), d)}
    if m.mlp == "swiglu":
        shapes["mlp.gate"] = (d, int(m.ffn_hidden))
    return shapes


def float8_params_per_block(m: Any, precision: Any = None) -> int:
    """Parameters of one block that run in float8 (the weights of its converted linear layers), on average over the
    blocks: in a mixture of experts' layers only the attention and the shared experts' MLP are converted (the
    routed experts are no linear layers, the router stays fp32: train/model/float8.py)."""
    from contract.rules.moe_shape import moe_layer_numbers, moe_of

    shapes = converted_shapes(m, precision)
    attention = sum(i * o for name, (i, o) in shapes.items() if name.startswith("attn."))
    mlp = sum(i * o for name, (i, o) in shapes.items() if name.startswith("mlp."))
    moe = moe_of(m)
    if moe is None:
        return attention + mlp
    n = int(m.n_layers)
    routed = len(moe_layer_numbers(m))
    shared = int(moe.get("shared_experts", 0) or 0)
    return attention + round(mlp * ((n - routed) + shared * routed) / n)


def config_refusal(cfg: Any) -> str | None:
    """Why this config can't train in fp8 (one line naming the fix), or None. The GPU is checked apart
    (gpu_refusal): a dry run for an H100 cluster plans on a laptop."""
    m, s = cfg.model, cfg.strategy
    recipe = str(cfg.precision.get("float8_recipe", "tensorwise"))
    if recipe not in RECIPES:
        return f"precision.float8_recipe={recipe} is not one of {', '.join(RECIPES)}"
    if m.get("_target_") or m.get("config_path"):
        return (f"precision=fp8 converts slurmtrain's own transformer's linear layers, and model={m.name} is another "
                f"model: use {WANTED}")
    odd = [f"{name} ({i} x {o})" for name, (i, o) in linear_shapes(m).items() if i % DIM_MULTIPLE or o % DIM_MULTIPLE]
    if odd:
        return (f"precision=fp8 needs every dimension of the blocks' linear layers divisible by {DIM_MULTIPLE} (float8 "
                f"tensor cores), and model={m.name} has {', '.join(odd)}: change model.d_model/n_heads/ffn_hidden or "
                f"use {WANTED}")
    if s.get("backend") == "deepspeed":
        return f"precision=fp8 is torchao's float8 training, which DeepSpeed does not run: use strategy=fsdp or {WANTED}"
    if not converted_shapes(m, cfg.precision):
        return (f"precision=fp8 would leave every linear layer of model={m.name} in bf16: each is too small for "
                f"float8 to pay (torchao's size rule, {small_layer(0, 0, recipe)}): use {WANTED}, or "
                "precision.float8_filter=all to convert them anyway")
    if int(cfg.parallel.get("tp", 1)) > 1:
        return f"precision=fp8 with tensor parallelism (parallel.tp={cfg.parallel.tp}) is not supported: set parallel.tp=1 or use {WANTED}"
    return None


def gpu_refusal(gpu_type: str | None, capability: tuple[int, int] | None, where: str) -> str | None:
    """Why the GPUs `where` names can't run fp8, or None: `capability` (a local GPU's, from nvidia-smi or torch)
    when known, else the cluster's gpu_type."""
    fix = f"run on Hopper or newer (+cluster=h100x8), or use {WANTED}"
    if capability is not None:
        if tuple(capability) >= MIN_CAPABILITY:
            return None
        return (f"precision=fp8 needs an NVIDIA GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or "
                f"newer (H100, H200, B200), and {where} has {capability[0]}.{capability[1]}: {fix}")
    if gpu_type is None:
        return (f"precision=fp8 needs an NVIDIA GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or "
                f"newer (H100, H200, B200), and {where} has none: {fix}")
    if not str(gpu_type).lower().startswith(FP8_GPU_TYPES):
        return (f"precision=fp8 needs an NVIDIA GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or "
                f"newer (H100, H200, B200), and {where} has {gpu_type}: {fix}")
    return None


def fp8_all_gather(cfg: Any) -> bool:
    """Whether FSDP2 all-gathers the converted weights in float8 (a tensorwise recipe under FSDP or HSDP)."""
    return (enabled(cfg.precision) and str(cfg.precision.get("float8_recipe", "tensorwise")) == "tensorwise"
            and str(cfg.strategy.name) in ("fsdp", "fsdp_grad_op", "hsdp"))


def float8_flops_per_token(m: Any, precision: Any = None) -> float:
    """Training FLOPs per token that run in float8: 6 per converted weight (forward and both backward products)."""
    return 6.0 * int(m.n_layers) * float8_params_per_block(m, precision)


def effective_peak(total_flops: float, float8_flops: float, peak_fp8: float, peak_bf16: float) -> float:
    """The peak TFLOP/s a device reaches on this mix: float8's share at the float8 peak, the rest (attention, the
    output layer) at bf16's. MFU against it is 100% only where every FLOP ran at its own peak."""
    bf16_flops = max(0.0, total_flops - float8_flops)
    return total_flops / (float8_flops / peak_fp8 + bf16_flops / peak_bf16)


def peak_tflops(precision: str, peaks: dict[str, float], m: Any, seq_len: int) -> float | None:
    """The dense peak TFLOP/s MFU counts against for `precision`, from peaks keyed by precision name (a cluster's
    peak_tflops). fp8: the mix of the fp8 and bf16 peaks (effective_peak) for our transformer; the bf16 peak alone
    when no fp8 peak is declared (torchtitan's convention) or the model is not ours. `precision`: its name, or the
    precision section (which layers its size rule converts)."""
    name = str(getattr(precision, "name", precision))
    if not enabled(name):
        return peaks.get(name)
    bf16, fp8 = peaks.get("bf16"), peaks.get("fp8")
    if bf16 is None or fp8 is None or m is None or m.get("_target_"):
        return bf16
    from contract.rules.flops import flops_per_token

    section = None if isinstance(precision, str) else precision
    return effective_peak(flops_per_token(m, seq_len), float8_flops_per_token(m, section), float(fp8), float(bf16))


def plan_line(cfg: Any) -> str:
    """The plan's line for precision=fp8 (empty otherwise): what runs in float8 and how it is scaled."""
    if not enabled(cfg.precision):
        return ""
    m = cfg.model
    share = float8_flops_per_token(m, cfg.precision) / max(1.0, _total_flops(m, int(cfg.data.seq_len)))
    recipe = str(cfg.precision.get("float8_recipe", "tensorwise"))
    gather = ", all-gathered in float8 by FSDP2" if fp8_all_gather(cfg) else ""
    from contract.rules.moe_shape import moe_of

    layers = (f"each block's {len(converted_shapes(m, cfg.precision))} linear layers" if moe_of(m) is None else
              "the attention's linear layers and the dense and shared-expert MLPs (not the routed experts nor the "
              "router)")
    kept = kept_in_bf16(m, cfg.precision)
    small = ""
    if kept:
        shapes = linear_shapes(m)
        names = ", ".join(f"{name} ({shapes[name][0]} -> {shapes[name][1]})" for name in kept)
        small = (f"; {names} stay in bf16, too small for float8 to pay (torchao's size rule, "
                 f"{next(iter(kept.values()))}; precision.float8_filter=all converts them)")
    return (f"precision fp8: {layers} in float8 via torchao ({recipe} "
            f"scaling{gather}), {share:.0%} of the FLOPs{small}; attention, the output layer and the rest in bf16; "
            "master weights and optimizer state fp32; MFU counts each FLOP at its own peak")


def _total_flops(m: Any, seq_len: int) -> float:
    from contract.rules.flops import flops_per_token

    return flops_per_token(m, seq_len)
