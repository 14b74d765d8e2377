"""trainer.loss_impl=fused on CPU ranks (issue 46 item 1): the real loop with the loss fused with the output layer
trains as the logits path does (fp32: the same losses to 1e-5 over 4 steps, z-loss on, the output weight tied to the
embedding), under DDP and FSDP2 (whose root unit holds the output weight: used inside the model's forward, it is
gathered as for the logits)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.dist.store import hosted_port
from tests.dist.workers import train_several

pytestmark = pytest.mark.dist

COMMON = ["precision=fp32", "trainer.max_steps=4", "optim.z_loss=1e-3", "trainer.ckpt_every=0"]


def test_the_fused_loss_trains_as_the_logits_path_under_ddp_and_fsdp(tmp_path: Path) -> None:
    runs = {f"{strategy}-{impl}": [f"strategy={strategy}", f"trainer.loss_impl={impl}", *COMMON]
            for strategy in ("ddp", "fsdp") for impl in ("chunked", "fused")}
    mp.spawn(train_several, args=(2, hosted_port(2), str(tmp_path), runs), nprocs=2)
    losses = {name: torch.load(tmp_path / name / "losses_rank0.pt") for name in runs}
    for strategy in ("ddp", "fsdp"):
        logits_path, fused = losses[f"{strategy}-chunked"], losses[f"{strategy}-fused"]
        assert sorted(fused) == [1, 2, 3, 4], fused
        assert fused[4] < fused[1], fused  # it learns
        for step, value in logits_path.items():
            assert fused[step] == pytest.approx(value, rel=1e-5), (strategy, step, fused, logits_path)
