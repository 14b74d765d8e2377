"""The launch plan's memory estimate against what each rank really holds, on 2 CPU ranks: parameters, gradients and
optimizer state (the unique tensor storages reachable from the model and optimizer, at the step's peak) within 5%
of the estimate for every strategy that shards differently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.dist.memory_workers import measure_states
from tests.dist.store import hosted_port

pytestmark = pytest.mark.dist

MODEL = ["model.d_model=128", "model.n_layers=8", "model.n_heads=4", "model.ffn_hidden=512", "model.vocab_size=1000",
         "data.seq_len=32", "trainer.micro_batch_size=2"]
RUNS = {
    **{s: [*MODEL, f"strategy={s}"] for s in ("ddp", "fsdp", "fsdp_grad_op", "zero1", "zero2", "zero3")},
    # DeepSpeed's bf16 weights and gradients with an fp32 master partition (ZeRO's 4 + 12/N bytes per parameter).
    "zero1_bf16": [*MODEL, "strategy=zero1", "precision=bf16"],
}


def test_states_held_per_rank_match_the_estimate(tmp_path: Path) -> None:
    mp.spawn(measure_states, args=(2, hosted_port(2), str(tmp_path), RUNS), nprocs=2)
    for rank in range(2):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert sorted(results) == sorted(RUNS)
        for name, r in results.items():
            assert abs(r["estimated"] / r["measured"] - 1) <= 0.05, (rank, name, r)
    # The layouts really differ: sharding halves what fsdp holds against ddp, ZeRO-1 holds more than ZeRO-3.
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    assert r0["fsdp"]["measured"] < 0.55 * r0["ddp"]["measured"]
    assert r0["zero3"]["measured"] < r0["zero2"]["measured"] < r0["zero1"]["measured"]
    assert r0["zero1_bf16"]["measured"] < r0["zero1"]["measured"]
