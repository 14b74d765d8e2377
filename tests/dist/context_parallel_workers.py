"""Workers of tests/dist/test_context_parallel.py on gloo groups: the model's logits and gradients under cp=2
against the whole sequence on one rank, and short runs of the training loop (one spawn for all of them)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf

from contract.config.training import ModelConfig
from tests.dist.workers import _join, planned
from train import distributed
from train.faults.preemption import TEST_SIGNAL_ENV
from train.loop import train
from train.model.transformer import Transformer
from train.strategies.context_parallel import ContextShard, attach, chunk_positions

SEQ = 2048
# The tiny model at a long context, in the forms whose positions and attention cp changes.
MODELS = {
    "rope": {},
    "rope-gqa": {"n_kv_heads": 2, "tie_embeddings": False},
    "learned": {"position": "learned", "mlp": "gelu", "norm": "layernorm"},
    "rope-documents": {},
    # The masks of the CUDA path (flex attention's BlockMask of the rank's queries against the group's keys), eager.
    "rope-documents-flex": {},
}


def _model(overrides: dict[str, object]) -> Transformer:
    cfg = OmegaConf.structured(ModelConfig(name="tiny", d_model=64, n_layers=2, n_heads=4, ffn_hidden=192,
                                           max_seq_len=SEQ))
    torch.manual_seed(0)
    return Transformer(OmegaConf.merge(cfg, overrides))


def compare_logits(rank: int, world: int, out_dir: str) -> None:
    """Per model form: the largest difference of this rank's logits, and of the gradients averaged over the cp
    ranks, from those of the whole sequence computed on one rank."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (2, SEQ + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    docs = torch.cumsum(torch.rand(2, SEQ, generator=generator) < 0.004, dim=1).to(torch.int32)
    mine = chunk_positions(SEQ, world, rank)
    out = {}
    for name, overrides in MODELS.items():
        kwargs = {"document_ids": docs} if "documents" in name else {}
        whole = _model(overrides)
        logits = whole(inputs, **kwargs)
        F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1)).backward()
        split = _model(overrides)
        attach(split, ContextShard(dist.group.WORLD, world, rank, flex=name.endswith("flex")))
        flex = name.endswith("flex")  # flex attention has no backward on CPU: the logits only
        with torch.set_grad_enabled(not flex):
            local = split(inputs[:, mine], **kwargs)
        grad_diff = None
        if not flex:
            F.cross_entropy(local.reshape(-1, 256), targets[:, mine].reshape(-1)).backward()
            grad_diff = 0.0
            for (_, p), (_, q) in zip(whole.named_parameters(), split.named_parameters(), strict=True):
                dist.all_reduce(q.grad)
                grad_diff = max(grad_diff, float((q.grad / world - p.grad).abs().max()))
        out[name] = {"logits": float((local - logits[:, mine]).abs().max()), "grads": grad_diff,
                     "scale": float(logits.abs().max())}
    torch.save(out, Path(out_dir) / f"logits_rank{rank}.pt")


def run_all(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]], logits: bool,
            stop_at: int = 10) -> None:
    """One process group for everything: the logits comparison (`logits`, on 2 ranks), then each run's losses; a
    run named *-stopped gets the preemption signal after step `stop_at` (rank 0) and the next run, of the same name
    without the suffix, resumes it in the same run directory."""
    env = _join(rank, world, port)
    try:
        if logits:
            compare_logits(rank, world, out_dir)
        for name, overrides in runs.items():
            run_name = name.removesuffix("-stopped")
            cfg = planned([f"local.nproc={world}", "logger.backend=none", "trainer.log_every=1", f"run.root={out_dir}",
                           f"run.name={run_name}", *overrides])
            run_dir = Path(out_dir) / run_name
            run_dir.mkdir(parents=True, exist_ok=True)
            if name.endswith("-stopped"):
                os.environ[TEST_SIGNAL_ENV] = f"{stop_at}:0"
            try:
                result = train(cfg, env, torch.device("cpu"), run_dir)
            finally:
                os.environ.pop(TEST_SIGNAL_ENV, None)
            if rank == 0:
                torch.save({"losses": result.losses, "exit": result.outcome.exit_code, "tokens": result.state.tokens},
                           Path(out_dir) / f"{name}.pt")
    finally:
        distributed.destroy_process_group()
