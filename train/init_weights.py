"""model.init_from: start a run from saved weights (fine-tuning, continued pretraining) rather than random ones.

Only the model's weights are taken: the optimizer, the schedule and the data position start fresh. They apply at a
run's first start only; a resume loads the run's own checkpoint. The weights go into the model as built on every
rank, before the strategy wraps it (loop.py), so every strategy takes them the same way it takes a random init
(DDP broadcasts rank 0's, FSDP and tensor parallelism shard each rank's full copy, a pipeline stage keeps its
layers, DeepSpeed copies them into its partitions) and a checkpoint of any strategy and world size loads on any
other. Each rank reads the weights itself: safetensors tensor by tensor from a memory map (a Hugging Face model's
under the names `from_pretrained` gives them: train/hf_conversion.py), DCP checkpoints
(reassembled from any number of shards) straight into the parameters, DeepSpeed checkpoints consolidated on CPU.
The optimizer state is never read: DCP reads only the model's entries, and DeepSpeed's consolidation takes the
master weights out of its optimizer files through a memory map, leaving the moments beside them untouched.

An evaluation job (train/evaluation/job.py) loads its checkpoint the same way (`master=False`): a ZeRO-1/2
checkpoint's model states file holds the weights as the engine ran its forward with them (in the compute dtype),
so it reads that file alone and never opens the optimizer's.

The launcher asks the same question before anything runs (`python -m launcher.worker --init-from`, a child
process: launcher/plan/init_from.py): do the names and shapes match the model built on the meta device?
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from launcher.errors import ConfigError
from train import ckpt_layout as layout
from train.export import MODEL_PREFIX, clean_key, tie_groups
from train.hf_conversion import Conversion, ConversionFailed
from train.init_source import KEY, MODEL_DIR, InitSource, resolve
from train.weight_files import SAFETENSORS, tensor_shapes

Shapes = dict[str, tuple[int, ...]]


# -- what the weights hold -------------------------------------------------------------------------------------
def dcp_keys(step_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{model name: (the key DCP stored it under, its full shape)} of a DCP checkpoint, from its metadata only."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(step_dir / MODEL_DIR)).read_metadata().state_dict_metadata
    return {clean_key(k[len(MODEL_PREFIX):]): (k, tuple(m.size)) for k, m in metadata.items()
            if k.startswith(MODEL_PREFIX) and isinstance(m, TensorStorageMetadata)}


def _deepspeed_shapes(step_dir: Path) -> Shapes:
    """The parameters' and buffers' shapes DeepSpeed records in its model states file (no weights loaded)."""
    files = sorted((step_dir / MODEL_DIR).glob("*model_states.pt"))
    return _model_states_shapes(torch.load(files[0], map_location="meta", weights_only=False))


def _model_states_shapes(state: dict[str, Any]) -> Shapes:
    shapes: Shapes = {}
    for group in state.get("param_shapes") or []:
        shapes.update({clean_key(name): tuple(shape) for name, shape in group.items()})
    for name in state.get("buffer_names") or []:
        tensor = (state.get("module") or {}).get(name)
        if tensor is not None:
            shapes[clean_key(name)] = tuple(tensor.shape)
    return shapes


@dataclass(frozen=True)
class Found:
    """What the weights hold under the model's names: each tensor's shape and the saved tensors it is made of
    (itself, but for a Hugging Face checkpoint converted as from_pretrained converts it: train/hf_conversion.py)."""
    shapes: Shapes
    saved: dict[str, tuple[str, ...]]
    conversion: Conversion | None = None  # weight files: how their saved tensors become the model's

    def count(self, names: Iterable[str | None]) -> int:
        """How many saved tensors these names are read from."""
        return len({key for name in names if name is not None for key in self.saved[name]})


def _as_found(shapes: Shapes) -> Found:
    return Found(shapes, {name: (name,) for name in shapes})


def _file_shapes(src: InitSource) -> Shapes:
    try:
        return tensor_shapes(list(src.files))
    except Exception as err:  # noqa: BLE001 - a file that is not weights: one line
        raise ConfigError(f"{KEY}={src.path} could not be read as weights ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:120] if str(err) else ''}): point it at a safetensors or torch "
                          "weights file, a Hugging Face model directory or a run's checkpoint") from None


def found_in(src: InitSource, model: nn.Module) -> Found:
    """The weights' names (the model's, for weight files) and shapes, from headers and metadata: nothing read.
    ConversionFailed when transformers can't convert a Hugging Face checkpoint's tensors for this model."""
    if src.kind == "dcp":
        return _as_found({name: shape for name, (_, shape) in dcp_keys(src.path).items()})
    if src.kind == "deepspeed":
        return _as_found(_deepspeed_shapes(src.path))
    saved = _file_shapes(src)
    conversion = Conversion(model, saved)
    shapes: Shapes = {}
    origins: dict[str, tuple[str, ...]] = {}
    for name, tensor, keys in conversion.tensors(lambda key: torch.empty(saved[key], device="meta")):
        shapes[name], origins[name] = tuple(tensor.shape), keys
    return Found(shapes, origins, conversion)


# -- do they fit the model -------------------------------------------------------------------------------------
def model_shapes(model: nn.Module) -> Shapes:
    return {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}


def _ignored(model: nn.Module) -> list[re.Pattern[str]]:
    """Names a Hugging Face model says its saved weights may hold and it does not (old rotary buffers)."""
    return [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]


def sources_for(expected: Shapes, groups: list[list[str]], found: Shapes) -> dict[str, str | None]:
    """{model name: the name it is read from}: itself, or a tied name the weights hold (a tied output layer is
    saved once), or None when the weights hold neither."""
    tied = {name: group for group in groups for name in group}
    out: dict[str, str | None] = {}
    for name in expected:
        candidates = [name, *(n for n in tied.get(name, []) if n != name)]
        out[name] = next((n for n in candidates if n in found), None)
    return out


def first_problem(expected: Shapes, groups: list[list[str]], found: Shapes,
                  ignored: list[re.Pattern[str]] | None = None) -> str | None:
    """The first parameter (in the model's order) the weights lack or hold in another shape, else the first
    tensor they hold that the model has not, as one clause; None when they fit."""
    for name, source in sources_for(expected, groups, found).items():
        if source is None:
            near = difflib.get_close_matches(name, list(found), n=1, cutoff=0.6)
            hint = f" (the nearest name there is {near[0]})" if near else f" (they hold {len(found)} tensors"
            hint += "" if near else (f", the first {next(iter(found))})" if found else ")")
            return f"the weights have no {name}{hint}"
        if found[source] != expected[name]:
            return (f"{name} is {list(expected[name])} in the model but {list(found[source])} in the weights")
    extra = [n for n in found if n not in expected and not any(p.search(n) for p in ignored or [])]
    if extra:
        return f"the weights hold {extra[0]}, which the model has not" + (
            f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
    return None


def _model_differences(src: InitSource, model_cfg: Any) -> list[str]:
    """model.* keys the checkpoint's run was trained with that this config sets otherwise."""
    from omegaconf import OmegaConf

    saved_file = src.path / "config.yaml"
    if model_cfg is None or not saved_file.is_file():
        return []
    try:
        saved: Any = OmegaConf.to_container(OmegaConf.load(saved_file).model, resolve=True)
    except Exception:  # noqa: BLE001 - no hint then
        return []
    ours = OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg) else dict(model_cfg)
    assert isinstance(saved, dict) and isinstance(ours, dict)
    keys = [k for k in saved if k not in ("init_from",) and saved.get(k) != ours.get(k)]
    if "name" in keys:
        return [f"model={saved['name']}"] + [f"model.{k}={saved[k]}" for k in keys if k != "name"][:3]
    return [f"model.{k}={json.dumps(saved[k]) if isinstance(saved[k], (dict, list)) else saved[k]}"
            for k in keys[:4]]


def fix_for(src: InitSource, model_cfg: Any) -> str:
    """How to make the weights and the model agree, as specific as the source allows."""
    if src.key != KEY:  # a run's own checkpoint, built from its own config: the model's code changed since
        return ("the model its config.yaml builds has changed since the checkpoint was written: evaluate it with the "
                "slurmtrain version that trained it")
    if src.checkpoint:
        differences = _model_differences(src, model_cfg)
        if differences:
            return (f"that checkpoint was trained with {' '.join(differences)}: set the same, or point {KEY} at "
                    "weights of this model")
    folder = src.path if src.path.is_dir() else src.path.parent
    config = folder / "config.json"
    if config.is_file() and model_cfg is not None and model_cfg.get("config_path") != str(config):
        return f"build the model they were saved with: model=hf_causal_lm model.config_path={folder}"
    return f"build the model these weights were saved from, or point {KEY} at weights of this model"


def _checked(model: nn.Module, src: InitSource, model_cfg: Any) -> tuple[Found, dict[str, str | None]]:
    """What the weights hold and {model name: the name it is read from}; ConfigError naming the first parameter
    that does not fit."""
    expected, groups = model_shapes(model), tie_groups(model)
    try:
        found = found_in(src, model)
    except ConversionFailed as err:
        raise ConfigError(f"{src.named()} does not fit the model: {err}: {fix_for(src, model_cfg)}") from None
    problem = first_problem(expected, groups, found.shapes, _ignored(model))
    if problem:
        raise ConfigError(f"{src.named()} does not fit the model: {problem}: {fix_for(src, model_cfg)}")
    return found, sources_for(expected, groups, found.shapes)


def check_fit(model: nn.Module, src: InitSource, model_cfg: Any) -> int:
    """How many saved tensors the weights give the model; ConfigError naming the first parameter that does not
    fit."""
    found, plan = _checked(model, src, model_cfg)
    return found.count(plan.values())


# -- loading ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def load_into(model: nn.Module, src: InitSource, model_cfg: Any = None, master: bool = True) -> int:
    """Copy the weights into `model` (every rank its own full copy, before wrapping); returns the tensors read.
    `master=False`: a DeepSpeed ZeRO-1/2 checkpoint gives the module's weights (what its forward ran with) from
    its model states file rather than its fp32 master weights from the optimizer's files; ZeRO-3 keeps only the
    master weights whole, so they are read either way."""
    found, plan = _checked(model, src, model_cfg)
    targets = model.state_dict(keep_vars=True)
    by_source: dict[str, list[torch.Tensor]] = {}
    for name, source in plan.items():
        by_source.setdefault(str(source), []).append(targets[name])
    if src.kind == "dcp":
        _load_dcp(src.path, by_source)
    elif src.kind == "deepspeed":
        from train.export import load_deepspeed_model

        module = None if master else deepspeed_module(src.path)
        _copy(module if module is not None else load_deepspeed_model(src.path), by_source)
    else:
        assert found.conversion is not None
        for name, tensor, _ in found.conversion.tensors(_reader(src.files), wanted=by_source.__contains__):
            for target in by_source[name]:
                target.copy_(tensor)
    return found.count(plan.values())


def deepspeed_module(step_dir: Path) -> dict[str, torch.Tensor] | None:
    """The module's weights a ZeRO-1/2 checkpoint's model states file holds whole (memory-mapped), or None: ZeRO-3
    saves only empty placeholders there."""
    files = sorted((step_dir / MODEL_DIR).glob("*model_states.pt"))
    if len(files) != 1:  # ZeRO-3 writes one per rank
        return None
    state = torch.load(files[0], map_location="cpu", mmap=True, weights_only=False)
    shapes = _model_states_shapes(state)
    tensors = {clean_key(k): v for k, v in (state.get("module") or {}).items() if isinstance(v, torch.Tensor)}
    if any(tuple(t.shape) != shapes.get(name, tuple(t.shape)) for name, t in tensors.items()):
        return None
    return tensors


def _copy(tensors: dict[str, torch.Tensor], by_source: dict[str, list[torch.Tensor]]) -> None:
    for key, tensor in tensors.items():
        for target in by_source.get(key, []):
            target.copy_(tensor)


def _reader(files: tuple[Path, ...]) -> Callable[[str], torch.Tensor]:
    """A saved tensor by its name, from whichever file holds it (each opened once: safetensors as a memory map,
    read one tensor at a time)."""
    holder: dict[str, Any] = {}
    for file in files:
        opened = _open(file)
        holder.update(dict.fromkeys(opened.keys(), opened))

    def read(key: str) -> torch.Tensor:
        opened = holder[key]
        return opened[key] if isinstance(opened, dict) else opened.get_tensor(key)

    return read


def _open(file: Path) -> Any:
    if file.suffix == SAFETENSORS:
        from safetensors import safe_open

        return safe_open(str(file), framework="pt", device="cpu")  # a memory map: one tensor at a time
    return torch.load(file, map_location="cpu", weights_only=True, mmap=True)


def _load_dcp(step_dir: Path, by_source: dict[str, list[torch.Tensor]]) -> None:
    """Read the model's tensors of a DCP checkpoint straight into the parameters, whatever world size wrote it;
    this rank alone (no collective), the optimizer state left unread."""
    import torch.distributed.checkpoint as dcp

    stored = {name: key for name, (key, _) in dcp_keys(step_dir).items()}
    wanted = {stored[name]: targets[0] for name, targets in by_source.items()}
    dcp.load(wanted, checkpoint_id=str(step_dir / MODEL_DIR), no_dist=True)
    for targets in by_source.values():  # tied names that are not one tensor here (none today)
        for other in targets[1:]:
            if other.data_ptr() != targets[0].data_ptr():
                other.copy_(targets[0])


# -- the rank's hook -------------------------------------------------------------------------------------------
def start_from(model: nn.Module, cfg: Any, run_dir: Path, env: Any) -> bool:
    """Load model.init_from into the freshly built model unless the run resumes its own checkpoint; True when
    it did. Every rank reads the weights (the same ones: they must be equal before wrapping)."""
    from train.metrics import log

    text = cfg.model.get("init_from")
    latest = layout.latest_complete_checkpoint(run_dir) if cfg.run.resume else None
    if latest is not None:
        if text and env.is_main:
            log.info("weights: the run's checkpoint %s (%s is not applied on resume)", latest.path.name, KEY)
        return False
    if not text:
        if env.is_main:
            log.info("weights: random init (seed %d)", cfg.trainer.seed)
        return False
    src = resolve(str(text))
    count = load_into(model, src, cfg.model)
    if env.is_main:
        log.info("weights: from %s (%d tensors%s); optimizer, schedule and data start fresh", src.describe(), count,
                 src.origin())
    return True


def refuse_lost_init(cfg: Any, applied: bool, state: Any) -> None:
    """After restore(): a run that skipped model.init_from to resume, but found no checkpoint it could trust
    (every one damaged, moved aside), would train from random weights. Stop instead: the next start applies it."""
    if cfg.model.get("init_from") and not applied and state.step == 0:
        raise ConfigError(f"no checkpoint of this run could be resumed (damaged ones were moved aside) and {KEY} "
                          "was not loaded: run the same command again to start from it")


# -- the launcher's question -----------------------------------------------------------------------------------
def init_from_fit(model: nn.Module, model_cfg: Any) -> dict[str, int]:
    """{"init_from_tensors": N} when model.init_from is set and fits `model` (on the meta device), {} when it is
    not set; ConfigError when it does not fit. Asked by the launch probe (train/probe.py) where a probe runs."""
    if not model_cfg.get("init_from"):
        return {}
    return {"init_from_tensors": check_fit(model, resolve(str(model_cfg.init_from)), model_cfg)}


def check(request: dict[str, Any]) -> dict[str, Any]:
    """python -m launcher.worker --init-from, for a model no probe builds (ours): {"init_from_tensors": N},
    {"error": ..., "kind": "config"} when the weights do not fit, {"error": ..., "kind": "build"} when the model
    can't be built here to compare (the ranks compare before loading)."""
    from omegaconf import OmegaConf

    from train.probe_build import build_for_probe

    model_cfg = OmegaConf.create(request["model"])
    try:
        built = build_for_probe(model_cfg)
        if built.model is None:
            return {"error": built.error or built.note, "kind": "build"}
        return init_from_fit(built.model, model_cfg)
    except ConfigError as err:
        return {"error": str(err), "kind": "config"}


def main() -> int:
    print(json.dumps(check(json.loads(sys.stdin.read()))))
    return 0
