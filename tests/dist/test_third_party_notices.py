"""Third-party notices that read like faults next to correct results (issue 36, item 4), absent from a tp=2 launch's
output: torch's FSDP2 view-tensor warning ("can cause backward to fail or produce wrong gradients") and DTensor's
two-reductions advice ("may give inconsistent results between ranks"). The filters (train/observe/quiet.py) let a
user's own model keep the first: tests/unit/test_third_party_notices.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import hq, launch

pytestmark = pytest.mark.dist


def test_a_tensor_parallel_run_says_nothing_of_wrong_gradients_or_inconsistent_ranks(tmp_path: Path) -> None:
    out = launch("local.nproc=2", "strategy=fsdp", "parallel.tp=2", "model.tie_embeddings=false",
                 "trainer.max_steps=2", "trainer.ckpt_every=0", "logger.backend=none", f"run.root={hq(tmp_path)}",
                 "run.name=tp")
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "finished at step 2" in text, text[-3000:]
    assert "can cause backward to fail" not in text and "returned a view tensor" not in text, text[-3000:]
    assert "inconsistent results between ranks" not in text, text[-3000:]
