"""No host read of a device value in a steady training step (issue 35, items 1 and 2): every strategy and feature on
CPU ranks, under train/observe/sync_count.py's counter (a TorchDispatchMode and a TorchFunctionMode over the loop).
A steady step is neither a log, validation, checkpoint, stop nor recovery step: each run here has some of each
kind, and steady steps right after a log step and after a save. On a CPU a read costs nothing, but the loop takes the
same path as on a GPU, where each one would stall the host (tests/gpu/test_sync_free_gpu.py checks it with CUDA's
own sync debug mode). One spawn per world size; every rank's count is checked."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from launcher.prepare.__main__ import main as prepare_main
from tests.conftest import hq
from tests.dist.store import hosted_port
from tests.dist.sync_workers import REINSTATED, count_reads
from tests.prepared_data import random_documents, write_prepared
from tests.sft_data import shift_records, write_tokenizer

pytestmark = pytest.mark.dist

# Steps 1..6: logged at 1, 4 and 6 (the last); a checkpoint at 3 where a run asks for it (and at 6): steady 2, 3, 5.
COMMON = ["trainer.max_steps=6", "trainer.log_every=4", "trainer.ckpt_every=0", "trainer.global_batch_size=8",
          "trainer.micro_batch_size=2"]
STEADY = [2, 3, 5]
DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Overrides for the two prepared data sets: supervised fine-tuning records, and packed documents."""
    root = tmp_path_factory.mktemp("sync data")
    shift_records(root / "pairs.jsonl", 300)
    assert prepare_main([str(root / "pairs.jsonl"), "--out", str(root / "sft"), "--tokenizer",
                         str(write_tokenizer(root / "tok")), "--prompt-field", "prompt", "--response-field", "response",
                         "--val-fraction", "0.02"]) == 0
    write_prepared(root / "docs", [random_documents(0, 4000)], [random_documents(1, 2000)])
    return {"sft": ["data=tokens", f"data.path={hq(root / 'sft')}", "model.vocab_size=20", "data.seq_len=16"],
            "docs": ["data=tokens", f"data.path={hq(root / 'docs')}", "model.vocab_size=257",
                     "data.document_mask=true"]}


def _count(tmp_path: Path, world: int, runs: dict[str, list[str]]) -> dict[str, list[dict]]:
    mp.spawn(count_reads, args=(world, hosted_port(world), str(tmp_path), {n: [*COMMON, *o] for n, o in runs.items()}),
             nprocs=world)
    return {name: [json.loads((tmp_path / name / f"reads_rank{r}.json").read_text()) for r in range(world)]
            for name in runs}


def _assert_none(name: str, ranks: list[dict], steady: list[int] = STEADY) -> None:
    for rank, counted in enumerate(ranks):
        assert counted["steady"] == steady, (name, rank, counted["steady"])
        assert counted["reads"] == [], f"{name}, rank {rank}: host reads in steady steps:\n{counted['report']}"


def test_one_process_reads_nothing_in_a_steady_step_and_a_loss_read_put_back_is_caught(tmp_path: Path) -> None:
    counted = _count(tmp_path, 1, {"single": ["strategy=single"],
                                   f"single{REINSTATED}": ["strategy=single"]})
    _assert_none("single", counted["single"])
    back = counted[f"single{REINSTATED}"][0]
    assert back["steady"] == STEADY
    # exactly the read put back: one a steady step, the loss's, where the loop adds it to the interval
    assert [(r[0], r[1]) for r in back["reads"]] == [(s, "_local_scalar_dense") for s in STEADY], back["report"]
    assert {r[2].split(" ")[0].rsplit(":", 1)[0] for r in back["reads"]} == {"train/loop.py"}, back["report"]


def test_every_strategy_and_feature_reads_nothing_in_a_steady_step(tmp_path: Path,
                                                                   data: dict[str, list[str]]) -> None:
    untied = ["model.tie_embeddings=false"]
    runs = {
        # supervised fine-tuning (response tokens counted), the spike rule and z-loss, batches loaded on the
        # training thread (no prefetch)
        "ddp-sft-spike": ["strategy=ddp", *data["sft"], "stability.spike_sigma=6", "stability.spike_window=4",
                          "optim.z_loss=1e-4", "trainer.prefetch_steps=0"],
        # document masking; an asynchronous checkpoint at step 3, step 5 after it
        "fsdp-docs-save": ["strategy=fsdp", *data["docs"], "trainer.ckpt_every=3", "checkpoint.async_save=true"],
        "hsdp": ["strategy=hsdp"],
        # the loss fused with the output layer (trainer.loss_impl=fused), with z-loss and targets that don't count
        "fsdp-fused-loss": ["strategy=fsdp", "trainer.loss_impl=fused", "optim.z_loss=1e-4", *data["sft"]],
        "tp2": ["strategy=fsdp", "parallel.tp=2", *untied],
        "pp2-sft": ["strategy=fsdp", "parallel.pp=2", *untied, *data["sft"], "trainer.micro_batch_size=1"],
    }
    counted = _count(tmp_path, 2, runs)
    for name, ranks in counted.items():
        steady = [2, 5] if name == "fsdp-docs-save" else STEADY
        _assert_none(name, ranks, steady)


@pytest.mark.skipif(not DEEPSPEED, reason="needs deepspeed")
def test_zero_strategies_read_only_inside_the_deepspeed_engine(tmp_path: Path) -> None:
    """DeepSpeed's engine reads values every step itself (its overflow check of the gradient norm, the client
    optimizer's step counts, ZeRO-3's parameter coordinator): out of our hands, and named here; the loop around it
    reads nothing."""
    counted = _count(tmp_path, 2, {f"zero{stage}": [f"strategy=zero{stage}"] for stage in (1, 2, 3)})
    for name, ranks in counted.items():
        for rank, c in enumerate(ranks):
            assert c["steady"] == STEADY, (name, rank)
            ours = [r for r in c["reads"] if not r[3].startswith("deepspeed/")]
            assert ours == [], f"{name}, rank {rank}: reads outside the engine:\n{c['report']}"
