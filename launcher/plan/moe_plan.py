"""A mixture of experts and expert parallelism in the launch plan: the refusals (before anything is created) and the
plan's line (total parameters, which memory holds, and active ones, which FLOPs and MFU count). Pure arithmetic."""

from __future__ import annotations

import math
from typing import Any

from contract.errors import ConfigError
from contract.rules.moe_shape import mlp_params, moe_layer_numbers, moe_of


def check_moe(cfg: Any, world: int) -> None:
    """Refuse a MoE or ep setting that can't run, naming the fix."""
    m, p = cfg.model, cfg.parallel
    ep = int(p.get("ep", 1))
    if m.get("_target_"):  # a model of its own code (a Hugging Face one, the user's): its experts are its config's
        if moe_of(m) is not None:  # it trained, with routing metrics of experts the model did not have
            raise ConfigError(f"model.moe.num_experts={m.moe.num_experts} shapes slurmtrain's own transformer, and "
                              f"model={m.name} builds its model from model._target_ (its own config decides its "
                              "experts): drop model.moe.*")
        if ep > 1:
            raise ConfigError(f"parallel.ep={ep} splits the experts of slurmtrain's own transformer, and model={m.name} "
                              "is built by model._target_, which ep does not split: use parallel.ep=1")
        return
    moe = moe_of(m)
    if moe is None:
        if ep > 1:
            raise ConfigError(f"parallel.ep={ep} splits a mixture of experts and model={m.name} is dense: use a MoE "
                              "model (model=moe_tiny, or model.moe.num_experts=N), or parallel.ep=1")
        return
    experts, top_k = int(moe.num_experts), int(moe.top_k)
    if top_k > experts:
        raise ConfigError(f"model.moe.top_k={top_k} exceeds model.moe.num_experts={experts}: a token can't choose more "
                          f"experts than there are; set model.moe.top_k<={experts}")
    if not moe_layer_numbers(m):
        raise ConfigError(f"model.moe.every={moe.every} leaves no MoE layer in model.n_layers={m.n_layers}: set "
                          f"model.moe.every<={m.n_layers}")
    if experts % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide model.moe.num_experts={experts}: each ep rank holds the "
                          f"same number of experts; pick an ep that divides {experts}")
    tp, pp = int(p.tp), int(p.pp)
    cp = int(p.get("cp", 1))
    kv = m.get("n_kv_heads") or m.n_heads
    splits = not (int(m.n_heads) % tp or int(kv) % tp or int(m.ffn_hidden) % tp)  # else the layout's check says so
    if tp > 1 and splits and (int(cfg.data.seq_len) // cp) % tp:
        multiple = tp if cp == 1 else cp * math.lcm(2, tp)  # cp's 2 x cp chunks, each cp share in tp slices
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} does not split into parallel.tp={tp} equal slices"
                          f"{f' of each of its parallel.cp={cp} shares' if cp > 1 else ''}: each tp rank routes its "
                          f"slice of the sequence through the experts; use a data.seq_len that is a multiple of "
                          f"{multiple}")
    if ep == 1:
        return
    if cfg.strategy.get("backend") == "deepspeed":
        raise ConfigError(f"parallel.ep={ep} needs a torch strategy (ddp, fsdp, hsdp): strategy={cfg.strategy.name} "
                          "is DeepSpeed's")
    if cfg.precision.name == "fp16" and cfg.strategy.name in ("fsdp", "fsdp_grad_op", "hsdp"):
        raise ConfigError(f"precision=fp16 with parallel.ep={ep} under strategy={cfg.strategy.name} is not built: FSDP's "
                          "sharded loss scaler unscales only what FSDP shards, and ep keeps the experts out of it; use "
                          "precision=bf16, or strategy=ddp")
    dp = world // (tp * pp)
    if dp % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide the {dp} data-parallel ranks it is taken from: pick an ep "
                          f"that divides {dp}")


def moe_line(cfg: Any, n_params: int) -> str:
    """'mixture of experts: ...' for the plan, or '' for a dense model."""
    m = cfg.model
    moe = None if m.get("_target_") else moe_of(m)
    if moe is None:
        return ""
    experts, top_k = int(moe.num_experts), int(moe.top_k)
    active = n_params - mlp_params(m) + mlp_params(m, active=True)
    ep = int(cfg.parallel.get("ep", 1))
    routing = ("dropless" if not float(moe.capacity_factor) else
               f"capacity factor {float(moe.capacity_factor):g}: an expert takes at most "
               f"{math.ceil(float(moe.capacity_factor) * top_k / experts * 100) / 100:g} x tokens per micro batch, "
               "the rest dropped")
    shared = f", {moe.shared_experts} shared" if int(moe.shared_experts) else ""
    per_rank = experts // ep
    stages = " of a stage" if int(cfg.parallel.pp) > 1 else " of a tp index" if int(cfg.parallel.tp) > 1 else ""
    split = (f"; ep {ep}: {per_rank} expert{'s' if per_rank > 1 else ''} per rank{stages}, tokens exchanged by "
             "all-to-all" if ep > 1 else "")
    tp = int(cfg.parallel.tp)
    if tp > 1:
        split += (f"; tp {tp}: each tp rank routes its slice of the sequence, the MoE layers whole on every tp rank "
                  "(their gradients summed over tp)")
    cp = int(cfg.parallel.get("cp", 1))
    if cp > 1:
        split += f"; cp {cp}: the load-balancing loss over whole sequences (routed counts summed over the cp ranks)"
    return (f"mixture of experts: {experts} experts{shared}, top {top_k} ({routing}) in {len(moe_layer_numbers(m))} "
            f"of {m.n_layers} layers; {_count(n_params)} parameters in all (memory), {_count(active)} active per token "
            f"(FLOPs, MFU){split}")


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def active_params(cfg: Any, n_params: int) -> int:
    m = cfg.model
    if m.get("_target_") or moe_of(m) is None:
        return n_params
    return n_params - mlp_params(m) + mlp_params(m, active=True)
