"""examples/byo_project from an outside directory: its own model and data (`_target_`), its own config groups
(`--config-dir conf`), its own train.py beside them; every strategy on 2 local ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.sweeps.sweepdir import load_sweep
from tests.conftest import launch, read_metrics

pytestmark = pytest.mark.dist

# One of each family (fsdp_grad_op and hsdp share fsdp's wrapping; tests/dist/test_strategies.py runs them).
STRATEGIES = ["ddp", "fsdp", "zero2"]


def test_the_example_trains_on_2_ranks_with_every_strategy(byo_project: Path) -> None:
    out = launch("--config-dir", "conf", "-m", "model=conv_lm", "data=chars", f"strategy={','.join(STRATEGIES)}",
                 "trainer.max_steps=6", "trainer.log_every=1", "local.nproc=2", "logger.backend=none",
                 "launcher.sweep_name=strategies", cwd=byo_project, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = load_sweep(byo_project / "outputs" / "sweeps" / "strategies")
    finals = {}
    for point in sweep.points:
        run_dir = Path(point.run_dir)
        cfg = OmegaConf.load(run_dir / "config.yaml")
        # The project's own model and data, by _target_, with the project's args.
        assert cfg.model._target_ == "model.ConvLM" and cfg.data._target_ == "data.CharDataset"
        assert run_dir.name.startswith(f"conv_lm-{cfg.strategy.name}-")
        losses = [r["loss"] for r in read_metrics(run_dir)]
        assert len(losses) == 6 and losses[-1] < 0.9 * losses[0], (cfg.strategy.name, losses)
        finals[cfg.strategy.name] = losses[-1]
    assert sorted(finals) == sorted(STRATEGIES)
    # The same model, data and seed: every layout computes the same training run (fp32, up to reduction order).
    for name, loss in finals.items():
        assert loss == pytest.approx(finals["ddp"], rel=1e-4), (name, finals)
    # The plan asked the model: parameters counted from the model built on the meta device.
    assert "model 0.1M parameters" in out.stderr or "model 0.1M parameters" in out.stdout
