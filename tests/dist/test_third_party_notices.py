"""Third-party notices that read like faults next to correct results (issue 36, item 4), absent from a tp=2 launch's
output: torch's FSDP2 view-tensor warning ("can cause backward to fail or produce wrong gradients") and DTensor's
two-reductions advice ("may give inconsistent results between ranks"). The filters (train/observe/quiet.py) let a
user's own model keep the first: tests/unit/test_third_party_notices.py. A DeepSpeed run, without the build note
of its shared-memory all-reduce; and its checkpoint's export: its
standard output is the export's path, without DeepSpeed's consolidation notices or progress bars."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, hq, launch, launcher_env

pytestmark = pytest.mark.dist


def test_a_tensor_parallel_run_says_nothing_of_wrong_gradients_or_inconsistent_ranks(tmp_path: Path) -> None:
    out = launch("local.nproc=2", "strategy=fsdp", "parallel.tp=2", "model.tie_embeddings=false",
                 "trainer.max_steps=2", "trainer.ckpt_every=0", "logger.backend=none", f"run.root={hq(tmp_path)}",
                 "run.name=tp")
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "finished at step 2" in text, text[-3000:]
    assert "can cause backward to fail" not in text and "returned a view tensor" not in text, text[-3000:]
    assert "inconsistent results between ranks" not in text, text[-3000:]


def test_a_deepspeed_checkpoints_export_prints_its_path_alone(tmp_path: Path) -> None:
    out = launch("strategy=zero2", "trainer.max_steps=2", "logger.backend=none", f"run.root={hq(tmp_path)}",
                 "run.name=z2")
    assert out.returncode == 0, out.stderr[-3000:]
    # DeepSpeed's torch backend says it built its shared-memory all-reduce, on standard output, mid-run
    assert "built successfully" not in out.stdout + out.stderr, out.stdout[-3000:]
    export = subprocess.run([sys.executable, "-m", "launcher.export", str(tmp_path / "z2"), "--format", "safetensors"],
                            cwd=ROOT, env=launcher_env(), capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-3000:]
    assert export.stdout == f"{tmp_path / 'z2' / 'export' / 'step_2.safetensors'}\n", export.stdout
    for notice in ("Setting accelerator to CPU", "Processing zero checkpoint", "Loading checkpoint shards",
                   "Reconstructed fp32 state dict"):
        assert notice not in export.stderr, export.stderr[-3000:]
