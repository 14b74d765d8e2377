"""The architecture comes with the weights, end to end on 2 ranks: a run of a shape unlike the default's (GQA,
untied, another width, depth, eps and theta), then `model.init_from=RUN` with no shape key trains that shape from
its weights, and the same command resumes it from its own config once the source is gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.rundir import ckpt_layout as layout
from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist

SHAPE = {"d_model": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "max_seq_len": 24,
         "norm_eps": 1e-6, "rope_theta": 500.0, "tie_embeddings": False, "vocab_size": 200}
COMMON = ["local.nproc=2", "strategy=fsdp", "logger.backend=none", "trainer.log_every=1", "trainer.progress_bar=false"]


def test_init_from_a_run_with_no_shape_keys_trains_the_runs_shape(run_root: Path) -> None:
    base = launch(*COMMON, *(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in SHAPE.items()),
                  "trainer.max_steps=2", f"run.root={hq(run_root)}", "run.name=base")
    assert base.returncode == 0, base.stderr[-3000:]
    args = [*COMMON, f"model.init_from={hq(run_root / 'base')}", f"run.root={hq(run_root)}", "run.name=tuned"]
    tuned = launch(*args, "trainer.max_steps=1", "trainer.ckpt_every=1")
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    step = layout.step_dir(run_root / "base", 2)
    assert f"  shape: from {step / 'config.yaml'} (d_model 32, 1 layers, 4 heads (2 kv), ffn 48, vocab 200, " \
           "context 24, rope theta 500, swiglu, rmsnorm eps 1e-06, untied)" in tuned.stderr.splitlines()
    assert f"  weights: from {step} (" in tuned.stderr
    saved = OmegaConf.load(run_root / "tuned" / "config.yaml")
    assert {k: saved.model[k] for k in SHAPE} == SHAPE and saved.data.seq_len == 24
    plans = [json.loads((run_root / name / "plan.json").read_text()) for name in ("base", "tuned")]
    assert plans[0]["n_params"] == plans[1]["n_params"]
    assert [r["step"] for r in read_metrics(run_root / "tuned") if "loss" in r] == [1]
    # The same command, one step further, with the source gone: the run's own config.yaml has the shape.
    (run_root / "base").rename(run_root / "base moved")
    resumed = launch(*args, "trainer.max_steps=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "  shape: from the run's own config.yaml, which it resumes (d_model 32, " in resumed.stderr
    assert [r["step"] for r in read_metrics(run_root / "tuned") if "loss" in r] == [1, 2]
