"""The run name derived from the config, and the training settings it hashes: a run directory resumes only with
the same ones (launcher/checks/resume_checks.py compares them)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import DictConfig, OmegaConf

from launcher.checks.key_checks import plain_select

# Keys that don't change what is trained: excluded from the derived run name, so that the same experiment
# with more steps or another log interval resumes in the same directory.
NAME_EXCLUDED = ("run", "launcher", "local", "logger", "cluster", "checkpoint", "telemetry", "profile", "watchdog",
                 # What happens when a step goes wrong: a run may turn the checks or the spike rule on when resumed.
                 "stability",
                 # Validation reads the model, never changes what is trained.
                 "eval",
                 # The layout: a run may resume on another one (DCP reshards).
                 "parallel",
                 # A search's settings (its trials' own values are the searched keys, hashed like any other).
                 "search",
                 "trainer.max_steps",
                 # A budget the plan converts to trainer.max_steps: how long the run goes, like it.
                 "trainer.max_tokens", "trainer.max_epochs", "trainer.epochs_of",
                 # The end of a wsd stable phase, like trainer.max_steps how long the run goes: extending a run may
                 # move it (the plan says what the rate does across the resume).
                 "optim.decay_start_step",
                 # Resuming on changed data is a launch-time permission, not a setting of what is trained.
                 "data.allow_changed",
                 "trainer.log_every", "trainer.progress_bar", "trainer.ckpt_every", "trainer.prefetch_steps",
                 # When Python collects garbage: host timing only.
                 "trainer.gc_every",
                 # How the loss is computed (chunked or fused with the output layer): the same loss, its last bits aside.
                 "trainer.loss_impl",
                 # Derived from the global batch and the world size: a run may resume on another world size.
                 "trainer.grad_accum_steps", "optim.scaled_lr")


# Keys added after run names were first derived from the config: they change the name only when set to something
# other than their default, so that upgrading slurmtrain does not move existing runs to new directories (the same
# command must keep resuming them). Add every new training key here, with its default.
NAME_ONLY_IF_SET: dict[str, Any] = {"optim.lr_scaling": "none", "optim.reference_batch_size": None,
                    "optim.schedule": "cosine", "optim.decay_fraction": 0.2, "optim.decay_shape": "1-sqrt",
                    "optim.timescale": None, "optim.z_loss": 0.0,
                    "optim.no_decay": ["norm", "bias", "embedding"], "optim.momentum": None, "optim.nesterov": None,
                    "optim.ns_steps": None, "optim.beta2_decay": None, "optim.clip_threshold": None,
                    "model.norm_eps": 1e-5, "model._target_": None, "model.args": {}, "model.block": None, "model.config_path": None,
                    "model.init_from": None,
                    "data._target_": None, "data.args": {}, "data.sources": {}, "data.sft_layout": "packed",
                    "data.document_mask": False, "precision.float8_recipe": "tensorwise",
                    "precision.float8_filter": "auto",
                    "strategy.compile_unit": "blocks", "strategy.cuda_graphs": False,
                    "strategy.grad_compression": "auto", "strategy.powersgd_rank": 4}


def hashed(key: str) -> bool:
    """Whether the derived run name hashes `key` (it is no NAME_EXCLUDED key, nor below one)."""
    return not any(key == excluded or key.startswith(f"{excluded}.") for excluded in NAME_EXCLUDED)


def training_settings(cfg: DictConfig) -> dict[str, Any]:
    """The settings that decide what is trained: the resolved config less NAME_EXCLUDED (and NAME_ONLY_IF_SET keys
    at their defaults). Their hash names the run; a run directory resumes only with the same ones."""
    data: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    for key, default in NAME_ONLY_IF_SET.items():
        if plain_select(data, key, default) == default:
            _drop(data, key)
    for key in NAME_EXCLUDED:
        _drop(data, key)
    return data


def derived_run_name(cfg: DictConfig) -> str:
    digest = hashlib.sha1(json.dumps(training_settings(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return f"{cfg.model.name}-{cfg.strategy.name}-{cfg.precision.name}-{digest}"


def _drop(data: dict[Any, Any], key: str) -> None:
    node: Any = data
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.get(p, {})
    node.pop(leaf, None)

