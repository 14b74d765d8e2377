"""What a checkpoint holds besides the run's files: the model and optimizer as one Stateful for DCP (a
fused-layout checkpoint refused), every RNG's state, and the small files written beside the shards.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from contract.rundir import ckpt_layout as layout
from contract.rundir import env_faults
from train.checkpoints import manifest as manifest
from train.strategies.expert_parallel import ExpertParallel, expert_parallel_of


class ModelOptimState(Stateful):
    """Adapter DCP calls at save (state_dict) and after load (load_state_dict)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loading: bool = False) -> None:
        self.model, self.optimizer, self.loading = model, optimizer, loading

    def state_dict(self) -> dict[str, Any]:
        """What is saved; with `loading`, what DCP reads into (its template): the parameters' state only. The
        groups are this run's: how many there are depends on the layout (FSDP with parallel.ep keeps the experts'
        whole tensors in groups of their own), and a template group the checkpoint lacks failed the load ("Missing
        key ... param_groups.2"): an fsdp ep=1 checkpoint could not resume under ep=2."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        expert_parallel = expert_parallel_of(getattr(self.model, "module", self.model))
        if expert_parallel is not None:  # each expert whole in the checkpoint: it loads under another ep
            expert_parallel.globalize(model_sd, optim_sd)
        if self.loading:
            optim_sd = {k: v for k, v in optim_sd.items() if k != "param_groups"}
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The saved state of each parameter (matched by name); each group's settings stay this run's config's. The
        saved groups' settings are the writing run's, and a checkpoint grouped otherwise (written before
        optim.no_decay, whose default moved the embeddings) would leave a group without them, or give a parameter
        another group's weight decay. The rate is the schedule's, set when the scheduler loads."""
        configured = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        if "param_groups" not in state_dict["optim"]:  # read without them (a template with `loading`): this run's
            state_dict["optim"]["param_groups"] = get_state_dict(self.model, self.optimizer)[1]["param_groups"]
        ExpertParallel.localize(state_dict["model"], state_dict["optim"])
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])
        for group, settings in zip(self.optimizer.param_groups, configured, strict=True):
            group.update(settings)


def refuse_fused_layout(dcp_dir: Path) -> None:
    """Checkpoints of our transformer written before its projections were split (fused attn.kv and SwiGLU up,
    which tensor parallelism can't shard) name parameters this model no longer has: say so in one line."""
    from contract.errors import ConfigError

    try:
        keys = dcp.FileSystemReader(str(dcp_dir)).read_metadata().state_dict_metadata
    except Exception:  # unreadable metadata: DCP's own load reports it
        return
    if any(k.endswith(".attn.kv.weight") for k in keys):
        raise ConfigError(f"{dcp_dir.parent} was written by a slurmtrain older than commit decf8fb, whose transformer "
                          "fused attn.kv: finish this run with that older release (commit a56c7c7 or before), or start "
                          "over with run.resume=false run.overwrite=true")


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _serialized(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _write_files(files: dict[Path, bytes]) -> None:
    for path, data in files.items():
        env_faults.disk_full_in_checkpoint(path)  # tests only
        layout.write_durably(path, data)
