"""The plan's weights line: which weights a run starts from, always (model.init_from, a random init, or on resume
the run's own checkpoint), and a refusal before anything is created when model.init_from does not fit the model.

Names and shapes are compared in a child process (`python -m launcher.worker --init-from`, train/weights/init_weights.py:
the model on the meta device against the weights' headers or checkpoint metadata); this module stays torch-free.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.errors import ConfigError
from contract.rules.init_source import KEY, resolve, saved_weights
from contract.rundir import ckpt_layout as layout
from launcher.plan.code_change import code_lines
from launcher.plan.probe import ask, needs_probe, probe_request
from launcher.run.rundir_paths import CLEARED_BY_OVERWRITE


def normalize(cfg: DictConfig) -> None:
    """model.init_from as an absolute path: the ranks may start elsewhere, and the run name hashes it."""
    text = cfg.model.get("init_from")
    if text:
        with open_dict(cfg):
            cfg.model.init_from = str(Path(str(text)).expanduser().resolve())


def refuse_inside_overwritten(cfg: DictConfig, run_dir: Path) -> None:
    """run.overwrite=true deletes the run's checkpoints before the ranks start: model.init_from must not point at
    them (the run directory itself, its checkpoints/, a step_N, a file inside; symlinks resolved on both sides)."""
    init = cfg.model.get("init_from")
    if not init or not cfg.run.overwrite:
        return
    source = Path(str(init)).expanduser().resolve()
    cleared = [run_dir.resolve(), *((run_dir / name).resolve() for name in CLEARED_BY_OVERWRITE)]
    if any(source.is_relative_to(path) for path in cleared):
        raise ConfigError(f"{KEY}={init} lies inside the run directory {run_dir} that run.overwrite=true clears: copy "
                          "the weights elsewhere and point model.init_from there, or use another run.name")


def _resumes(cfg: DictConfig, run_dir: Path) -> layout.CheckpointDir | None:
    if not cfg.run.resume or cfg.run.overwrite:
        return None
    return layout.latest_complete_checkpoint(run_dir)


def weights_lines(cfg: DictConfig, run_dir: Path, world_size: int) -> tuple[str, ...]:
    """'weights: ...' and, where a run would silently start from random weights beside a saved model, a warning.
    The comparison is the launch probe's answer where one runs (the same request: no second child), else its own."""
    refuse_inside_overwritten(cfg, run_dir)
    init = cfg.model.get("init_from")
    latest = _resumes(cfg, run_dir)
    if latest is not None:
        note = f" ({KEY} is not applied on resume)" if init else ""
        return (f"weights: the run's checkpoint {latest.path.name}{note}", *code_lines(cfg, run_dir, latest))
    if not init:
        lines = [f"weights: random init (seed {cfg.trainer.seed})"]
        saved = saved_weights(str(cfg.model.config_path)) if cfg.model.get("config_path") else None
        if saved is not None:
            lines.append(f"warning: model.config_path={cfg.model.config_path} sits beside a saved model ({saved.name}) "
                         f"that this run does not load: it trains from random weights; add {KEY}={saved.parent} "
                         "to start from them")
        return tuple(lines)
    source = resolve(str(init))  # a missing path, a run without a checkpoint, a file that is not weights
    if needs_probe(cfg):
        answer = ask(probe_request(cfg, world_size))
    else:
        answer = ask({"model": OmegaConf.to_container(cfg.model, resolve=True)}, "--init-from")
    if answer.get("kind") in ("config", "target"):
        raise ConfigError(answer["error"])
    if "init_from_tensors" in answer:
        return (f"weights: from {source.describe()} ({answer['init_from_tensors']} tensors{source.origin()})",)
    why = answer.get("error") or answer.get("note") or "the model was not built"
    return (f"weights: from {source.describe()} (not compared with the model at launch: {why}; the ranks compare "
            f"them before loading{source.origin()})",)
