"""model.init_from: start a run from saved weights (fine-tuning, continued pretraining) rather than random ones.

Only the model's weights are taken: the optimizer, the schedule and the data position start fresh. They apply at a
run's first start only; a resume loads the run's own checkpoint. The weights go into the model as built on every
rank, before the strategy wraps it (loop.py), so every strategy takes them the same way it takes a random init
(DDP broadcasts rank 0's, FSDP and tensor parallelism shard each rank's full copy, a pipeline stage keeps its
layers, DeepSpeed copies them into its partitions) and a checkpoint of any strategy and world size loads on any
other. Each rank reads the weights itself: safetensors tensor by tensor from a memory map (a Hugging Face model's
under the names `from_pretrained` gives them: train/weights/hf_conversion.py), DCP checkpoints
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

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contract.errors import ConfigError
from contract.rules.init_source import KEY, MODEL_DIR, RESUME_KEY, InitSource, checkpoint_source, resolve
from contract.rundir import ckpt_layout as layout
from train.weights.export import clean_key
from train.weights.files import tensor_reader
from train.weights.fit import _checked, _model_states_shapes, check_fit, dcp_keys


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
        from train.weights.export import load_deepspeed_model

        module = None if master else deepspeed_module(src.path)
        _copy(module if module is not None else load_deepspeed_model(src.path), by_source)
    else:
        assert found.conversion is not None
        for name, tensor, _ in found.conversion.tensors(tensor_reader(src.files), wanted=by_source.__contains__):
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
    from train.observe.metrics import log

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
    not set; ConfigError when it does not fit. Asked by the launch probe (train/model/probe.py) where a probe runs."""
    if not model_cfg.get("init_from"):
        return {}
    return {"init_from_tensors": check_fit(model, resolve(str(model_cfg.init_from)), model_cfg)}


def check(request: dict[str, Any]) -> dict[str, Any]:
    """python -m launcher.worker --init-from, for a model no probe builds (ours): {"init_from_tensors": N},
    {"error": ..., "kind": "config"} when the weights do not fit, {"error": ..., "kind": "build"} when the model
    can't be built here to compare (the ranks compare before loading)."""
    from omegaconf import OmegaConf

    from train.model.probe_build import build_for_probe

    model_cfg = OmegaConf.create(request["model"])
    try:
        built = build_for_probe(model_cfg)
        if built.model is None:
            return {"error": built.error or built.note, "kind": "build"}
        if request.get("resume_from"):  # a resume after the code changed: does its checkpoint fit the new model?
            src = checkpoint_source(Path(request["resume_from"]), key=RESUME_KEY)
            return {"resume_tensors": check_fit(built.model, src, model_cfg)}
        return init_from_fit(built.model, model_cfg)
    except ConfigError as err:
        return {"error": str(err), "kind": "config"}


def main() -> int:
    print(json.dumps(check(json.loads(sys.stdin.read()))))
    return 0
