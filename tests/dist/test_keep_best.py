"""checkpoint.keep_best on a real run whose validation loss turns up after a point (issue 30, acceptance 4): the
learning rate rises through a 40-step warmup to a peak far too high for `tiny`, so the validation loss falls, then
climbs. With checkpoint.keep_last=1 retention would keep only the newest checkpoint; the best one survives beside it,
through a resume (the run trained in two commands), launcher.status names it, and launcher.export --best and
launcher.sample --best read it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract.rundir import ckpt_layout as layout
from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics

pytestmark = pytest.mark.dist

RISING_LR = ("optim.schedule=constant", "optim.warmup_steps=40", "optim.lr=1.0")


def command(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=launcher_env(),
                          cwd=ROOT, timeout=300)


def test_the_best_checkpoint_survives_retention_and_a_resume(run_root: Path) -> None:
    args = ["eval.every=5", "trainer.ckpt_every=5", "trainer.log_every=5", "checkpoint.keep_last=1",
            "checkpoint.keep_best=val/val/loss", *RISING_LR, "logger.backend=none", f"run.root={hq(run_root)}",
            "run.name=rising"]
    for max_steps in (20, 40):  # the second command resumes the first's run at step 20
        out = launch(*args, f"trainer.max_steps={max_steps}")
        assert out.returncode == 0, out.stderr[-3000:]
    run_dir = run_root / "rising"
    losses = {row["step"]: row["val/val/loss"] for row in read_metrics(run_dir) if "val/val/loss" in row}
    assert sorted(losses) == list(range(5, 45, 5))
    best = min(losses, key=lambda step: losses[step])
    assert best < 40 and losses[40] > losses[best] + 1.0, losses  # the loss turned up: the newest is not the best
    assert [c.step for c in layout.list_checkpoints(run_dir)] == [best, 40]

    status = command("launcher.status", str(run_dir), "--json")
    [row] = json.loads(status.stdout)["rows"]
    assert row["best"] == {"metric": "val/val/loss", "direction": "lower is better", "step": best,
                           "value": losses[best]}
    assert f"best checkpoint: step {best}, val/val/loss {losses[best]:.4f}" in command("launcher.status",
                                                                                     str(run_dir)).stdout

    exported = command("launcher.export", str(run_dir), "--best")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.strip() == str(run_dir / "export" / f"step_{best}.safetensors")
    assert f"best checkpoint by the run's checkpoint.keep_best: step {best}, val/val/loss" in exported.stderr
    from safetensors import safe_open

    with safe_open(exported.stdout.strip(), "pt") as f:
        assert f.metadata()["step"] == str(best)

    sampled = command("launcher.sample", str(run_dir), "--best", "--tokens", "1,2,3", "--max-new-tokens", "4")
    assert sampled.returncode == 0, sampled.stderr
    # A refusal after --best chose is one line (the best checkpoint's line came before it).
    refused = command("launcher.sample", str(run_dir), "--best", "--tokens", "99999999")
    assert refused.returncode == 2 and refused.stderr.strip().startswith("error: --tokens holds 99999999")
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"checkpoints/step_{best} (greedy" in sampled.stderr
