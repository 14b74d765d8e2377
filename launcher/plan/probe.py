"""Ask a user's model (`model._target_`, `data._target_`, model=hf_causal_lm) what the plan needs to know.

The launcher never imports torch, and a user's model needs it: the question goes to a child process
(train/model/probe.py), which imports the targets from the user's project directory and builds the model on the meta
device (a model that loads weights as it is built: on the CPU within a bound, or counted from its weight files), and
asks the strategy whether it can train it. One answer per distinct request per process, so a sweep asks once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from contract.errors import ConfigError
from contract.rules.optimizers import count_shapes
from launcher.plan.estimate import ModelShape

_answers: dict[str, dict[str, Any]] = {}


@dataclass(frozen=True)
class Probe:
    shape: ModelShape | None
    # Why there is no shape (the model could not be built nor its weights read), or how the shape was had where the
    # plan should say so (from the weight files' shapes): the plan prints it and goes on.
    note: str = ""
    # The samples of a user's dataset (its len: an epoch); None when it was not asked (launcher.force) or not read.
    data_samples: int | None = None


def needs_probe(cfg: DictConfig) -> bool:
    return bool(cfg.model.get("_target_") or cfg.data.get("_target_"))


def project_env() -> dict[str, str]:
    """The child's environment: the user's project directory importable, as it is for the ranks."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    return env


def ask(request: dict[str, Any], question: str = "--probe") -> dict[str, Any]:
    """The child's one-line JSON answer to `python -m launcher.worker QUESTION` (--probe, --init-from)."""
    key = json.dumps(request, sort_keys=True)
    if question + key not in _answers:
        try:
            out = subprocess.run([sys.executable, "-m", "launcher.worker", question], input=key, text=True,
                                 capture_output=True, timeout=600, env=project_env(), check=False)
        except subprocess.TimeoutExpired:
            return {"error": "building the model took over 10 minutes", "kind": "build"}
        lines = out.stdout.strip().splitlines()
        try:
            _answers[question + key] = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            detail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"the model probe failed: {detail}", "kind": "build"}
    return _answers[question + key]


def probe_request(cfg: DictConfig, world_size: int) -> dict[str, Any]:
    """What the probe is asked (the same config asks once: launcher/plan/init_from.py reads the same answer)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    return {
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        # A user's dataset is asked for its first sample, unless forced (data only the compute nodes can read).
        "data": data if data.get("_target_") and not cfg.launcher.force else {},  # type: ignore[union-attr]
        "seq_len": int(cfg.data.seq_len),
        "data_target": cfg.data.get("_target_"),
        "strategy": OmegaConf.to_container(cfg.strategy, resolve=True),
        "world_size": world_size,
    }


def probe(cfg: DictConfig, world_size: int) -> Probe:
    """The model's shape for the estimate; raises ConfigError for a target that can't be imported, arguments it
    does not take, blocks that can't be found, a model the strategy can't train (on `world_size` ranks), or a first
    sample that does not fit the config (the ranks would fail the same way, after waiting in the queue), or
    model.init_from weights that do not fit the model."""
    answer = ask(probe_request(cfg, world_size))
    if "facts" in answer:
        f = answer["facts"]
        shape = ModelShape(f["n_params"], f["block_params"], f["n_blocks"], f["largest_root"], f["root"],
                           f["largest_param"], None, None, f["flops_per_token"] if f["flops_source"] == "model" else None,
                           param_shapes=count_shapes((tuple(s), bool(h)) for s, h in f.get("param_shapes", ())) or None)
        return Probe(shape, answer.get("note", ""), answer.get("data_samples"))
    if answer.get("kind") in ("target", "config"):
        raise ConfigError(answer["error"])
    return Probe(None, f"memory not estimated: {answer['error']}")
