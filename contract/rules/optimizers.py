"""The optimizers a config can choose (`optim=NAME`), what each reads, what state it keeps per parameter, which
strategies can step it, and what weight decay skips (no torch: the launch plan computes the same on a login node).

  adamw      torch's AdamW, fused: two fp32 moments per parameter
  sgd        torch's SGD, fused, with optim.momentum (one fp32 buffer per parameter; none at momentum 0) and
             optim.nesterov; weight decay is torch's SGD's, L2 added to the gradient
  adafactor  torch's Adafactor algorithm (Shazeer & Stern 2018 as torch writes it, optim.lr the relative step size):
             a matrix keeps a row and a column second-moment factor (rows + columns floats), a vector its own
  muon       torch's Muon (Newton-Schulz orthogonalised momentum, learning rate matched to AdamW's RMS as Moonlight
             does, so optim.lr and optim.weight_decay serve both) for the 2-D weights of the model's repeated blocks,
             AdamW for the rest (embeddings, head, norms, biases): one fp32 buffer per hidden-matrix parameter, two for
             the others. Sharded matrices are gathered whole for the orthogonalisation (train/optimizers/muon.py)
  lion       lion-pytorch's Lion (Chen et al. 2023, the sign of an interpolated momentum): one fp32 buffer

Weight decay skips the parameters optim.no_decay names: `norm` (a normalisation layer's weight and bias), `bias`,
`embedding` (an embedding table, and an output layer tied to it), `vector` (every parameter of fewer than two
dimensions, the rule before optim.no_decay). The default skips norms, biases and embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from contract.errors import ConfigError

OPTIMIZERS = ("adamw", "sgd", "adafactor", "muon", "lion")
NO_DECAY_KINDS = ("norm", "bias", "embedding", "vector")
# The optimizer-specific keys and the optimizers that read them; set for another optimizer, a key is refused.
READS = {"beta1": ("adamw", "muon", "lion"), "beta2": ("adamw", "muon", "lion"), "eps": ("adamw", "muon"),
         "momentum": ("sgd", "muon"), "nesterov": ("sgd", "muon"), "ns_steps": ("muon",),
         "beta2_decay": ("adafactor",), "clip_threshold": ("adafactor",)}
# What each optimizer needs set (its conf/optim YAML sets them).
NEEDS = {"sgd": ("momentum", "nesterov"), "muon": ("momentum", "nesterov", "ns_steps"),
         "adafactor": ("beta2_decay", "clip_threshold")}
FP32 = 4
# Which strategies can step each optimizer. DeepSpeed's ZeRO steps its client optimizer on flat 1-D fp32 partitions:
# an elementwise update (AdamW, SGD, Lion) is the same there, a factored or orthogonalised one (Adafactor, Muon) is
# not; ZeRO-Offload steps only DeepSpeed's CPU Adam.
ELEMENTWISE = ("adamw", "sgd", "lion")


def state_floats(name: str, shape: tuple[int, ...], hidden: bool, momentum: float | None = None) -> int:
    """fp32 values the optimizer keeps for one parameter of `shape` (`hidden`: a 2-D weight of a repeated block)."""
    numel = math.prod(shape)
    if name == "adamw":
        return 2 * numel
    if name == "sgd":
        return numel if momentum else 0
    if name == "lion":
        return numel
    if name == "adafactor":
        if len(shape) < 2:
            return numel
        return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    if name == "muon":
        return numel if hidden and len(shape) == 2 else 2 * numel
    raise ValueError(f"optim.name={name} is not one of {', '.join(OPTIMIZERS)}")


def state_bytes(optim: Any, params: Iterable[tuple[tuple[int, ...], bool, int]]) -> float:
    """The optimizer state of the whole model, unsharded: `params` is each distinct parameter shape, whether it is
    a hidden matrix, and how many parameters have it (a model's repeated blocks counted once and multiplied, so the
    cost does not grow with the layer count)."""
    name, momentum = optim.name, optim.get("momentum")  # read once: a config lookup per parameter is slow
    return float(FP32 * sum(count * state_floats(name, tuple(shape), hidden, momentum)
                            for shape, hidden, count in params))


def count_shapes(params: Iterable[tuple[tuple[int, ...], bool]]) -> tuple[tuple[tuple[int, ...], bool, int], ...]:
    """(shape, hidden) pairs, one per parameter, as the (shape, hidden, count) groups `state_bytes` reads."""
    counts: dict[tuple[tuple[int, ...], bool], int] = {}
    for shape, hidden in params:
        key = (tuple(shape), bool(hidden))
        counts[key] = counts.get(key, 0) + 1
    return tuple((shape, hidden, count) for (shape, hidden), count in counts.items())


def strategy_refusal(optim_name: str, strategy: Any) -> str | None:
    """Why this strategy can't step the optimizer (one line naming the fix), or None."""
    if strategy.get("backend") != "deepspeed" or optim_name == "adamw":
        return None
    if strategy.get("offload_optimizer"):
        return (f"optim={optim_name} with strategy={strategy.name}: ZeRO-Offload steps only DeepSpeed's CPU Adam; use "
                "optim=adamw, or strategy=fsdp (which shards the optimizer state too)")
    if optim_name not in ELEMENTWISE:
        what = "factors each matrix's second moment" if optim_name == "adafactor" else "orthogonalises each matrix"
        return (f"optim={optim_name} with strategy={strategy.name}: DeepSpeed steps flat 1-D partitions and "
                f"{optim_name} {what}; use strategy=fsdp (the same sharding, ZeRO-3 layout) or fsdp_grad_op (ZeRO-2)")
    return None


def check_optim(optim: Any) -> None:
    """A key the optimizer does not read, a value it needs left unset, or an unknown no_decay kind: one line that
    names the fix."""
    from contract.config.schema import OptimConfig

    name = optim.name
    for key, readers in READS.items():
        if name not in readers and optim.get(key) != getattr(OptimConfig, key):
            fix = (f"only optim={readers[0]} reads it): drop it or choose optim={readers[0]}" if len(readers) == 1
                   else f"{', '.join(readers)} read it): drop it or choose one of those")
            raise ConfigError(f"optim.{key}={optim.get(key)} has no effect on optim={name} ({fix}")
    for key in NEEDS.get(name, ()):
        if optim.get(key) is None:
            raise ConfigError(f"optim={name} needs optim.{key}: set it (conf/optim/{name}.yaml has the usual value)")
    if name == "sgd" and optim.nesterov and not optim.momentum:
        raise ConfigError("optim.nesterov=true needs momentum: set optim.momentum (0.9 is usual) or optim.nesterov=false")
    unknown = [kind for kind in optim.no_decay if kind not in NO_DECAY_KINDS]
    if unknown:
        raise ConfigError(f"optim.no_decay names {', '.join(map(str, unknown))}, which is not one of "
                          f"{', '.join(NO_DECAY_KINDS)}: set for example optim.no_decay=[norm,bias,embedding] "
                          "(optim.no_decay=[] decays every parameter)")


def no_decay_words(optim: Any) -> str:
    """The plan's words for what weight decay applies to, e.g. `weight decay 0.1, not on norms, biases, embeddings`."""
    if not float(optim.weight_decay):
        return "no weight decay"
    kinds = {"norm": "norms", "bias": "biases", "embedding": "embeddings", "vector": "tensors of fewer than 2 dims"}
    skipped = [kinds[k] for k in NO_DECAY_KINDS if k in optim.no_decay]
    what = "L2 " if optim.name == "sgd" else ""
    return f"{what}weight decay {float(optim.weight_decay):g}" + (f", not on {', '.join(skipped)}" if skipped
                                                                  else ", on every parameter")


def describe(optim: Any) -> str:
    """The plan's words for the optimizer and its own keys."""
    name = optim.name
    if name in ("adamw", "lion"):
        own = f"betas {optim.beta1:g}/{optim.beta2:g}" + (f", eps {optim.eps:g}" if name == "adamw" else "")
    elif name == "sgd":
        own = f"momentum {optim.momentum:g}" + (", nesterov" if optim.nesterov else "")
    elif name == "adafactor":
        own = f"beta2_decay {optim.beta2_decay:g}, clip_threshold {optim.clip_threshold:g}"
    else:
        own = (f"momentum {optim.momentum:g}{', nesterov' if optim.nesterov else ''}, {optim.ns_steps} Newton-Schulz "
               f"steps on the blocks' matrices; AdamW (betas {optim.beta1:g}/{optim.beta2:g}) on the rest")
    return f"{name} ({own})"


def plan_line(optim: Any, bytes_per_param: float | None) -> str:
    """The launch plan's optimizer line: what steps, what weight decay skips, and the state it keeps."""
    state = "" if bytes_per_param is None else f"; state {bytes_per_param:.3g} bytes/parameter"
    return f"optimizer {describe(optim)}; {no_decay_words(optim)}{state}"
