"""data.document_mask's flex attention path on one CUDA GPU (skipped without CUDA): compiled flex attention with a
block mask gives a packed document the logits it has alone, as the CPU's dense mask does, and a run trains with it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import hq, launch, read_metrics
from tests.prepared_data import write_prepared

pytestmark = pytest.mark.gpu


def _model() -> torch.nn.Module:
    from train.model.transformer import Transformer

    cfg = OmegaConf.create({"vocab_size": 512, "d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                            "ffn_hidden": 256, "max_seq_len": 512, "position": "rope", "rope_theta": 10000.0,
                            "norm": "rmsnorm", "mlp": "swiglu", "dropout": 0.0, "tie_embeddings": False,
                            "init_std": 0.02})
    torch.manual_seed(0)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_flex_attention_gives_a_packed_document_its_logits_alone(dtype: torch.dtype, atol: float) -> None:
    from train.model.document_mask import uses_flex

    cpu, gpu = _model(), _model().cuda()
    first, second = 200, 312  # the boundary inside a 128-token block: flex attention masks within the block
    packed = torch.randint(0, 512, (2, first + second))
    docs = torch.cat([torch.zeros(2, first), torch.ones(2, second)], 1).to(torch.int32)
    assert uses_flex(torch.device("cuda"))
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        masked = gpu(packed.cuda(), document_ids=docs.cuda()).float().cpu()
        alone = gpu(packed[:, first:].cuda()).float().cpu()
    with torch.no_grad():
        dense = cpu(packed, document_ids=docs)  # the CPU's dense mask
    assert torch.allclose(masked[:, first:], alone, atol=atol)
    assert torch.allclose(masked, dense, atol=atol)


def test_a_run_trains_with_flex_attention(run_root: Path, tmp_path: Path) -> None:
    rng, stream = np.random.default_rng(0), []
    while len(stream) < 200_000:
        stream += [*rng.integers(0, 256, int(rng.integers(20, 400))).tolist(), 256]
    write_prepared(tmp_path / "prep", [stream], [stream[:20_000]])
    out = launch("model=gpt2_124m", "model.vocab_size=257", "data=tokens", f"data.path={hq(tmp_path / 'prep')}",
                 "data.document_mask=true", "data.seq_len=512", "precision=bf16", "local.nproc=1",
                 "local.backend=nccl", "optim.lr=1e-3", "trainer.micro_batch_size=4", "trainer.max_steps=5",
                 "trainer.log_every=1", "eval.every=5", "logger.backend=none", f"run.root={hq(run_root)}",
                 "run.name=g")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "attention: block-causal by document, positions restart at each document (flex attention)" in out.stderr
    rows = [r for r in read_metrics(run_root / "g") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
