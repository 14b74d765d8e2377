"""The worker of tests/dist/test_document_mask.py: short runs with data.document_mask on a gloo group, each
followed by the wrapped model's logits on a batch of two packed documents and on the second document alone."""

from __future__ import annotations

from pathlib import Path

import torch

from launcher.compose import compose_and_plan
from tests.dist.workers import _join
from train import distributed
from train.loop import train
from train.model.build import logits_of

FIRST, SECOND = 20, 44  # two documents filling the tiny model's 64 positions (even lengths: tp=2 splits sequences)


def packed_and_alone(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows of two documents each (ids below the end-of-document id), their document ids, and the second
    document of each row alone."""
    generator = torch.Generator().manual_seed(7)
    packed = torch.randint(0, vocab - 1, (2, FIRST + SECOND), generator=generator)
    docs = torch.cat([torch.zeros(2, FIRST), torch.ones(2, SECOND)], 1).to(torch.int32)
    return packed, docs, packed[:, FIRST:].contiguous()


def train_and_compare(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]]) -> None:
    env = _join(rank, world, port)
    try:
        for name, overrides in runs.items():
            cfg, _ = compose_and_plan([f"local.nproc={world}", "logger.backend=none", "trainer.log_every=1",
                                       f"run.root={out_dir}", f"run.name={name}", *overrides])
            run_dir = Path(out_dir) / name
            run_dir.mkdir(parents=True, exist_ok=True)
            result = train(cfg, env, torch.device("cpu"), run_dir)
            out: dict[str, object] = {"losses": result.losses}
            if int(cfg.parallel.pp) == 1:  # a pipeline stage holds part of the model: its losses say enough
                packed, docs, alone = packed_and_alone(int(cfg.model.vocab_size))
                masked = bool(cfg.data.document_mask)
                with torch.no_grad():
                    out["packed"] = logits_of(result.model(packed, **({"document_ids": docs} if masked else {})))
                    out["alone"] = logits_of(result.model(alone))
            if rank == 0:
                torch.save(out, run_dir / "result.pt")
    finally:
        distributed.destroy_process_group()
