"""The repeated blocks of a model: the unit FSDP shards, activation checkpointing recomputes and compile compiles.

Any model works: the block class is named in the config (`model.block=MyBlock`), or found automatically: the class
Hugging Face models declare in `_no_split_modules`, else the children of the largest list (`nn.ModuleList` or
`nn.Sequential`) of at least two modules of one class. `model.block=none` says the model has no blocks.
"""

from __future__ import annotations

from torch import nn

from contract.errors import ConfigError
from contract.rules.per_block import compiles_blocks, needs_blocks

NO_BLOCKS = "none"


class BlockError(ConfigError):
    """The block class can't be found or the named one does not exist; the message names the fix."""


def _class_names(module: nn.Module) -> tuple[str, str]:
    cls = type(module)
    return cls.__name__, f"{cls.__module__}.{cls.__qualname__}"


def _outermost(model: nn.Module, wanted: set[type]) -> list[tuple[str, nn.Module]]:
    """Modules of the wanted classes that are not inside another one of them, in registration order."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if module is model or type(module) not in wanted:
            continue
        if any(name.startswith(prefix + ".") for prefix, _ in found):
            continue
        found.append((name, module))
    return found


def _named_class(model: nn.Module, block: str) -> set[type]:
    wanted = {type(m) for m in model.modules() if block in _class_names(m)}
    if not wanted:
        seen = sorted({type(m).__name__ for m in model.modules() if m is not model}
                      - {"ModuleList", "Sequential", "ModuleDict"})
        raise BlockError(f"model.block={block} names no module of this model: pick one of {', '.join(seen)} "
                         f"(or model.block={NO_BLOCKS})")
    return wanted


def _hf_declared(model: nn.Module) -> set[type]:
    declared = set(getattr(model, "_no_split_modules", None) or [])
    return {type(m) for m in model.modules() if m is not model and type(m).__name__ in declared}


def _largest_list(model: nn.Module) -> set[type]:
    best: tuple[int, type] | None = None
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
            continue
        children = list(container.children())
        kinds = {type(c) for c in children}
        if len(children) < 2 or len(kinds) != 1:
            continue
        size = sum(p.numel() for p in container.parameters())
        if best is None or size > best[0]:
            best = (size, kinds.pop())
    return set() if best is None else {best[1]}


def block_classes(model: nn.Module, block: str | None, needed_for: str | None = "sharding") -> set[type]:
    """The block classes of `model`; empty for model.block=none. Raises BlockError when none can be found and
    `needed_for` says why they are needed (None: a model without blocks is fine)."""
    if block == NO_BLOCKS:
        return set()
    if block:
        return _named_class(model, block)
    wanted = _hf_declared(model) or _largest_list(model)
    if not wanted and needed_for:
        raise BlockError(
            f"no repeated block found in {type(model).__name__} (no list of two or more modules of one class), and "
            f"{needed_for}: name the block class with model.block=ClassName, or set model.block={NO_BLOCKS} to "
            "train it as one unit"
        )
    return wanted


def find_blocks(model: nn.Module, block: str | None, needed_for: str | None = "sharding") -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every block, outermost first."""
    wanted = block_classes(model, block, needed_for)
    return _outermost(model, wanted) if wanted else []


def blocks_for(model: nn.Module, model_cfg: object, strategy_cfg: object) -> list[tuple[str, nn.Module]]:
    """The blocks this strategy config works with; BlockError when it needs blocks the model does not have."""
    named = find_blocks(model, getattr(model_cfg, "block", None), needs_blocks(strategy_cfg))
    wants_blocks = getattr(strategy_cfg, "activation_checkpointing", False) or compiles_blocks(strategy_cfg)
    if wants_blocks and not named:
        raise BlockError("activation checkpointing and compile work per block, and model.block=none says there are "
                         "none: name the block class with model.block=ClassName, or drop them")
    return named


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def prepare_blocks(model: nn.Module, model_cfg: object, strategy_cfg: object) -> list[nn.Module]:
    """Per-block activation checkpointing and torch.compile, the same for every strategy. Returns the blocks (as
    wrapped) for the strategy to shard."""
    named = blocks_for(model, model_cfg, strategy_cfg)
    if getattr(strategy_cfg, "activation_checkpointing", False):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        wrapped = []
        for name, block in named:
            new = checkpoint_wrapper(block)
            _replace(model, name, new)
            wrapped.append((name, new))
        named = wrapped
    if compiles_blocks(strategy_cfg):
        from contract.rules.compile_modes import compile_mode

        mode = compile_mode(strategy_cfg)
        for _, block in named:
            block.compile(**({"mode": mode} if mode else {}))
    return [block for _, block in named]
