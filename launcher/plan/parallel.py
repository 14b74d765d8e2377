"""Tensor, pipeline and data parallel degrees on one device mesh, laid onto the cluster: checked before launch.

Mesh dimensions, outermost first: data-parallel replicas (HSDP), data-parallel shards (FSDP), context-parallel
ranks, pipeline stages, tensor-parallel ranks. Rank r = (((dp * cp) + c) * pp + stage) * tp + t: tensor-parallel
ranks are neighbours (one node, NVLink), then a sequence's context-parallel ranks, a data-parallel group's stages
follow each other (consecutive nodes), data parallelism is outermost.
Pure arithmetic; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from contract.errors import ConfigError

SCHEDULES = ("1f1b", "interleaved_1f1b")
# Micro batches per pipeline stage below which the bubble dominates (the rule: at least 4 x pp).
MIN_MICRO_PER_STAGE = 4
BUBBLE_WARN = 0.20
# Strategies that compose with tensor and pipeline parallelism (DTensor meshes); DeepSpeed's ZeRO does not.
COMPOSABLE = ("single", "ddp", "fsdp", "fsdp_grad_op", "hsdp")


@dataclass(frozen=True)
class Degrees:
    tp: int
    pp: int
    dp: int
    ranks_per_node: int
    virtual: int  # model chunks per pipeline rank (interleaved schedule)
    cp: int = 1  # context-parallel ranks sharing each sequence (taken from the data-parallel ranks)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp


def degrees(cfg: DictConfig, world: int, ranks_per_node: int) -> Degrees:
    p = cfg.parallel
    virtual = int(p.pp_virtual_stages) if p.pp_schedule == "interleaved_1f1b" else 1
    cp = int(p.get("cp", 1))
    return Degrees(int(p.tp), int(p.pp), max(1, world // (int(p.tp) * int(p.pp) * cp)), ranks_per_node, virtual, cp)


def check_layout(cfg: DictConfig, world: int, ranks_per_node: int) -> Degrees:
    """Refuse layouts that can't run or would run badly; the message names the fix."""
    d = degrees(cfg, world, ranks_per_node)
    check_context(cfg, d, world)
    if d.tp == 1 and d.pp == 1:
        return d
    p, m = cfg.parallel, cfg.model
    if world % d.model_parallel:
        raise ConfigError(f"parallel.tp={d.tp} x parallel.pp={d.pp} = {d.model_parallel} does not divide the world "
                          f"size {world}: the degrees (times the data-parallel size) must multiply to {world}")
    if m.get("_target_"):
        raise ConfigError("parallel.tp/pp need slurmtrain's transformer (they split its attention, MLP and layers): "
                          f"model._target_={m._target_} trains with parallel.tp=1 parallel.pp=1")
    if d.tp > 1:
        if d.tp > ranks_per_node and not p.allow_cross_node_tp:
            raise ConfigError(f"parallel.tp={d.tp} spans nodes of {ranks_per_node} GPUs: tensor parallelism over the "
                              f"network collapses MFU; use parallel.tp<={ranks_per_node} (and parallel.pp across "
                              "nodes), or parallel.allow_cross_node_tp=true to force it")
        if ranks_per_node % d.tp and d.tp < ranks_per_node and not p.allow_cross_node_tp:
            raise ConfigError(f"parallel.tp={d.tp} does not divide the {ranks_per_node} GPUs per node: some "
                              "tensor-parallel groups would straddle two nodes; pick a divisor of "
                              f"{ranks_per_node}")
        kv = m.n_kv_heads or m.n_heads
        if m.n_heads % d.tp or kv % d.tp:
            raise ConfigError(f"parallel.tp={d.tp} does not divide model.n_heads={m.n_heads} and "
                              f"model.n_kv_heads={kv}: pick a tp that divides both")
        if m.ffn_hidden % d.tp:
            raise ConfigError(f"parallel.tp={d.tp} does not divide model.ffn_hidden={m.ffn_hidden}: pick one that does")
    if d.tp > 1 and m.position == "learned":
        raise ConfigError("learned position embeddings (GPT-2) are not split by tensor parallelism yet: use "
                          "model.position=rope, or parallel.tp=1")
    if d.pp > 1 and cfg.precision.name == "fp16":
        raise ConfigError("precision=fp16 (loss scaling) with pipeline parallelism is not supported: use "
                          "precision=bf16")
    if (d.tp > 1 or d.pp > 1) and m.tie_embeddings:
        raise ConfigError(f"model={m.name} ties its embedding to its output layer, which tensor and pipeline "
                          "parallelism split apart: set model.tie_embeddings=false")
    if d.pp > 1:
        if p.pp_schedule not in SCHEDULES:
            raise ConfigError(f"parallel.pp_schedule={p.pp_schedule} is not one of {', '.join(SCHEDULES)}")
        chunks = d.pp * d.virtual
        if m.n_layers % chunks:
            raise ConfigError(f"model.n_layers={m.n_layers} does not split evenly over {chunks} pipeline chunks "
                              f"(parallel.pp={d.pp} x {d.virtual} per stage): pick parallel.pp (and parallel.pp_virtual_stages) "
                              "whose product divides the layers")
    return d


def check_context(cfg: DictConfig, d: Degrees, world: int) -> None:
    """parallel.cp: each sequence in 2 x cp equal chunks over cp ranks of slurmtrain's transformer."""
    if d.cp == 1:
        return
    p, m, span = cfg.parallel, cfg.model, d.tp * d.pp * d.cp
    if world % span:
        raise ConfigError(f"parallel.tp={d.tp} x parallel.pp={d.pp} x parallel.cp={d.cp} = {span} does not divide the "
                          f"world size {world}: the degrees (times the data-parallel size) must multiply to {world}")
    if m.get("_target_"):
        raise ConfigError(f"parallel.cp needs slurmtrain's transformer (it splits its attention and positions): "
                          f"model._target_={m._target_} trains with parallel.cp=1")
    seq_len = int(cfg.data.seq_len)
    if seq_len % (2 * d.cp):
        raise ConfigError(f"data.seq_len={seq_len} does not split into 2 x parallel.cp = {2 * d.cp} equal chunks (each "
                          f"rank holds a head and a tail chunk): use a data.seq_len that is a multiple of {2 * d.cp}")
    if bool(cfg.eval.get("async_jobs", False)):
        raise ConfigError(f"eval.async_jobs=true with parallel.cp={p.cp}: evaluation jobs have no context-parallel "
                          "layout yet; set eval.async_jobs=false and eval.every=N (in-loop validation splits "
                          "sequences as training does)")
    harness = cfg.eval.get("harness")
    if harness is not None and harness.get("tasks"):
        raise ConfigError(f"eval.harness.tasks with parallel.cp={p.cp}: harness requests run whole sequences on "
                          "each rank; train with parallel.cp=1, or drop eval.harness.tasks")


def check_composable(cfg: DictConfig, d: Degrees) -> None:
    """The data-parallel strategy must work on the tensor / pipeline / context mesh (a dry run still shows the
    plan)."""
    if d.model_parallel == 1 and d.cp == 1:
        return
    if cfg.strategy.name not in COMPOSABLE:
        dims = "parallel.tp/pp" if d.cp == 1 else "parallel.tp/pp/cp"
        raise ConfigError(f"{dims} compose with FSDP, HSDP or DDP, not strategy={cfg.strategy.name}: use "
                          "strategy=fsdp")
    if d.cp > 1 and cfg.strategy.name == "single":
        raise ConfigError(f"parallel.cp={d.cp} averages gradients over the ranks that share a sequence, which "
                          "strategy=single does not: use strategy=fsdp or strategy=ddp")
    if d.cp > 1 and d.model_parallel > 1 and cfg.strategy.name == "ddp":
        raise ConfigError(f"strategy=ddp does not compose with parallel.tp/pp and parallel.cp={d.cp}: use "
                          "strategy=fsdp (or hsdp)")
    if d.model_parallel == 1:
        return
    if d.dp > 1 and cfg.strategy.name == "ddp":
        raise ConfigError(f"strategy=ddp does not compose with parallel.tp/pp over {d.dp} replicas: use "
                          "strategy=fsdp (or hsdp)")


def check_micro_batches(d: Degrees, accum: int) -> None:
    """A pipeline step runs its accumulation steps as micro batches through the stages."""
    if d.pp > 1 and accum < MIN_MICRO_PER_STAGE * d.pp:
        raise ConfigError(f"parallel.pp={d.pp} needs at least {MIN_MICRO_PER_STAGE * d.pp} micro batches per step "
                          f"(4 x pp) and the step has {accum}: lower trainer.micro_batch_size (same global batch, more "
                          "micro batches) or raise trainer.grad_accum_steps")
    if d.pp > 1 and d.virtual > 1 and accum % d.pp:
        raise ConfigError(f"parallel.pp_schedule=interleaved_1f1b runs micro batches in rounds of parallel.pp={d.pp}, "
                          f"and the step has {accum}: make trainer.grad_accum_steps a multiple of {d.pp}")


def bubble(d: Degrees, micro_batches: int) -> float:
    """Idle share of a pipeline step: (pp - 1) / (v x m + pp - 1) for 1F1B (v = 1) and interleaved 1F1B."""
    if d.pp == 1:
        return 0.0
    return (d.pp - 1) / (d.virtual * micro_batches + d.pp - 1)


def coordinates(rank: int, d: Degrees) -> tuple[int, int, int]:
    """(data-parallel index, pipeline stage, tensor-parallel index) of a global rank."""
    t = rank % d.tp
    stage = (rank // d.tp) % d.pp
    return rank // (d.model_parallel * d.cp), stage, t


def placement(d: Degrees, world: int) -> list[str]:
    """Per node: which ranks it holds and what they are (one line per node)."""
    lines = []
    for node in range(max(1, world // d.ranks_per_node)):
        ranks = range(node * d.ranks_per_node, min(world, (node + 1) * d.ranks_per_node))
        parts: dict[tuple[int, int, int], list[int]] = {}
        for r in ranks:
            dp, stage, t = coordinates(r, d)
            parts.setdefault((dp, (r // d.model_parallel) % d.cp, stage), []).append(t)
        groups = [f"dp {dp}{f' cp {c}' if d.cp > 1 else ''} stage {stage} tp {tps[0]}"
                  + (f"-{tps[-1]}" if len(tps) > 1 else "") for (dp, c, stage), tps in parts.items()]
        lines.append(f"node {node}: ranks {ranks[0]}-{ranks[-1]}: {'; '.join(groups)}")
    return lines


def tp_spans_nodes(d: Degrees, world: int) -> bool:
    return any(len({(r // d.ranks_per_node) for r in range(g, g + d.tp)}) > 1 for g in range(0, world, d.tp))


def summary_lines(d: Degrees, world: int, micro_batches: int) -> list[str]:
    if d.cp > 1 and d.tp == 1 and d.pp == 1:
        return [context_line(d, world)]
    if d.tp == 1 and d.pp == 1:
        return []
    lines = [f"layout: tensor-parallel {d.tp} x pipeline {d.pp}" + (f" x context-parallel {d.cp}" if d.cp > 1 else "")
             + f" x data-parallel {d.dp} = {world} ranks"
             + (" (tensor parallelism spans nodes: forced)" if tp_spans_nodes(d, world) else "")]
    shown = placement(d, world)
    lines += [f"  {line}" for line in shown[:4]]
    if len(shown) > 4:
        lines.append(f"  ... {len(shown) - 4} more node(s) the same way")
    if d.cp > 1:
        lines.append(context_line(d, world))
    if d.pp > 1:
        share = bubble(d, micro_batches)
        lines.append(f"pipeline: {micro_batches} micro batches per step, bubble {share:.1%} of each step"
                     + (f" (warning: above {BUBBLE_WARN:.0%}: raise trainer.grad_accum_steps or use "
                        "parallel.pp_schedule=interleaved_1f1b)" if share > BUBBLE_WARN else ""))
    return lines


def context_line(d: Degrees, world: int) -> str:
    ranks = (f"neighbouring ranks (x tensor-parallel {d.tp})" if d.pp == 1 else
             f"ranks of a stage (x pipeline {d.pp} x tensor-parallel {d.tp})")
    return (f"context-parallel {d.cp}: each sequence in {2 * d.cp} chunks, a head and a tail on each of {d.cp} "
            f"{ranks} x data-parallel {d.dp} = {world} ranks; activations / {d.cp}")


def model_parallel_shape(shape: Any, d: Degrees) -> Any:
    """The share of the model one rank holds before data-parallel sharding: its stage's blocks, each split tp
    ways but for a MoE layer's feed-forward (whole on every tp rank, train/strategies/tensor_parallel.py); the
    embedding or the output layer (whichever its stage holds) split tp ways."""
    from dataclasses import replace

    from contract.rules.moe_shape import moe_layer_numbers, moe_mlp_params

    if d.tp == 1 and d.pp == 1:
        return shape
    blocks = shape.n_blocks // d.pp
    root = shape.root if d.pp == 1 else shape.largest_root
    moe_layers = len(moe_layer_numbers(shape.config)) if shape.config is not None else 0
    whole = moe_mlp_params(shape.config, active=False) if moe_layers and d.tp > 1 else 0  # one MoE layer's, not split
    block = shape.block_params // d.tp + whole - whole // d.tp
    unsplit = (whole - whole // d.tp) * moe_layers // d.pp  # the stage's MoE layers, beyond their 1 / tp
    return replace(shape, n_params=blocks * (shape.block_params // d.tp) + unsplit + root // d.tp,
                   block_params=block, n_blocks=blocks, largest_root=shape.largest_root // d.tp, root=root // d.tp,
                   activation_share=1 / d.tp)


def not_built(cfg: DictConfig, d: Degrees) -> str | None:
    """What the plan can lay out but training does not run yet."""
    return None

