"""Context parallelism (parallel.cp) on CPU ranks (gloo), issue 37 acceptance 4: at seq_len 2048 the tiny model's
logits and gradients under cp=2 equal those of the whole sequence on one rank (RoPE, GQA, learned positions, a
document mask; the flex mask of the CUDA path, forward only); cp=2 trains to cp=1's losses over 20 steps on 2 ranks
(and with activation checkpointing) and on 4 with fsdp, ddp, tp=2, hsdp and cp=4; a stopped and resumed cp run is
bitwise the uninterrupted one; document masking and supervised fine-tuning data (counted targets) compose; a cp
checkpoint evaluates on one process. Two spawns share everything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from contract.errors import EXIT_STOPPED
from launcher.prepare.__main__ import main as prepare_main
from tests.conftest import ROOT, launcher_env, read_metrics
from tests.dist.context_parallel_workers import MODELS, run_all
from tests.dist.store import hosted_port
from tests.forked_cli import run_module
from tests.prepared_data import random_documents, write_prepared
from tests.sft_data import shift_records, write_tokenizer

pytestmark = pytest.mark.dist

SFT_VOCAB = 20  # tests/sft_data.py's tokenizer
STEPS = ["trainer.max_steps=20", "trainer.ckpt_every=0", "precision=fp32", "trainer.global_batch_size=8",
         "model.tie_embeddings=false", "trainer.prefetch_steps=0"]


def _spawn(root: Path, world: int, runs: dict[str, list[str]], logits: bool = False) -> dict[str, dict]:
    mp.spawn(run_all, args=(world, hosted_port(world), str(root), runs, logits), nprocs=world)
    return {name: torch.load(root / f"{name}.pt") for name in runs}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("cp2")
    validate = ["eval.every=10", "eval.batches=2"]
    runs = {"cp1": [*STEPS, *validate, "strategy=fsdp", "trainer.micro_batch_size=4"],
            "cp2": [*STEPS, *validate, "strategy=fsdp", "parallel.cp=2", "trainer.micro_batch_size=8"],
            # each block's attention, all-gather included, recomputed in backward
            "cp2-ac": [*STEPS, "strategy=fsdp", "parallel.cp=2", "trainer.micro_batch_size=8",
                       "strategy.activation_checkpointing=true", "trainer.max_steps=5"]}
    return root, _spawn(root, 2, runs, logits=True)


@pytest.fixture(scope="module")
def four_ranks_at(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("cp4")
    write_prepared(root / "prep", [random_documents(0, 4000)], [random_documents(1, 2000)])
    shift_records(root / "pairs.jsonl", 400)  # prompt/response records: only the response tokens count
    assert prepare_main([str(root / "pairs.jsonl"), "--out", str(root / "sft"), "--tokenizer",
                         str(write_tokenizer(root / "tok")), "--prompt-field", "prompt", "--response-field",
                         "response"]) == 0
    sft = ["data=tokens", f"data.path={root / 'sft'}", f"model.vocab_size={SFT_VOCAB}", "data.seq_len=16",
           "trainer.micro_batch_size=1", "trainer.max_steps=3"]
    docs = ["data=tokens", f"data.path={root / 'prep'}", "model.vocab_size=257", "data.document_mask=true",
            "trainer.max_steps=3"]
    cp2 = [*STEPS, "strategy=fsdp", "parallel.cp=2", "trainer.micro_batch_size=4"]
    runs = {"cp1": [*STEPS, "strategy=fsdp", "trainer.micro_batch_size=2"],
            "cp2-fsdp": cp2,
            "cp2-ddp": [*STEPS, "strategy=ddp", "parallel.cp=2", "trainer.micro_batch_size=4"],
            "cp2-tp2": [*STEPS, "strategy=fsdp", "parallel.cp=2", "parallel.tp=2", "trainer.micro_batch_size=8"],
            "cp4": [*STEPS, "strategy=fsdp", "parallel.cp=4", "trainer.micro_batch_size=8"],
            # two replicas, each sharded over its shard x cp ranks (a 2-D mesh of flattened dimensions)
            "cp2-hsdp": [*STEPS, "strategy=hsdp", "strategy.replicate_degree=2", "parallel.cp=2",
                         "trainer.micro_batch_size=4", "trainer.max_steps=5"],
            "cp2-resumed-stopped": cp2,
            "cp2-resumed": cp2,
            "docs-cp1": [*STEPS, *docs, "strategy=fsdp", "trainer.micro_batch_size=2"],
            "docs-cp2": [*STEPS, *docs, "strategy=fsdp", "parallel.cp=2", "trainer.micro_batch_size=4"],
            "sft-cp1": [*STEPS, *sft, "strategy=fsdp"],
            "sft-cp2": [*STEPS, *sft, "strategy=fsdp", "parallel.cp=2"]}
    return root, _spawn(root, 4, runs)


@pytest.fixture(scope="module")
def four_ranks(four_ranks_at: tuple[Path, dict[str, dict]]) -> dict[str, dict]:
    return four_ranks_at[1]


@pytest.mark.parametrize("form", list(MODELS))
def test_cp2_logits_and_gradients_equal_the_whole_sequence(two_ranks: tuple[Path, dict[str, dict]],
                                                           form: str) -> None:
    root, _ = two_ranks
    for rank in range(2):
        got = torch.load(root / f"logits_rank{rank}.pt")[form]
        assert got["scale"] > 0.1  # logits that carry something
        assert got["logits"] < 1e-5, (form, rank, got)
        assert form.endswith("flex") or got["grads"] < 1e-6, (form, rank, got)  # flex: no backward on CPU


def test_cp2_trains_and_validates_to_cp1_losses_on_two_ranks(two_ranks: tuple[Path, dict[str, dict]]) -> None:
    _, runs = two_ranks
    reference, got = runs["cp1"]["losses"], runs["cp2"]["losses"]
    assert sorted(got) == list(range(1, 21)) and got[20] < got[1] - 0.2  # it learns
    for step, loss in reference.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), step
    root, _ = two_ranks
    validated = {name: [row["val/val/loss"] for row in read_metrics(root / name) if "val/val/loss" in row]
                 for name in ("cp1", "cp2")}
    assert len(validated["cp2"]) == 2 and validated["cp2"] == pytest.approx(validated["cp1"], rel=1e-5)
    recomputed = runs["cp2-ac"]["losses"]
    assert sorted(recomputed) == list(range(1, 6))
    for step, loss in recomputed.items():
        assert loss == pytest.approx(reference[step], rel=1e-5), step


@pytest.mark.parametrize("layout", ["cp2-fsdp", "cp2-ddp", "cp2-tp2", "cp4", "cp2-hsdp"])
def test_cp_trains_to_cp1_losses_on_four_ranks(four_ranks: dict[str, dict], layout: str) -> None:
    reference, got = four_ranks["cp1"]["losses"], four_ranks[layout]["losses"]
    assert sorted(got) == list(range(1, 6 if layout == "cp2-hsdp" else 21))
    for step, loss in got.items():
        assert loss == pytest.approx(reference[step], rel=1e-5), (layout, step)


def test_a_stopped_and_resumed_cp_run_is_bitwise_the_uninterrupted_one(four_ranks: dict[str, dict]) -> None:
    stopped, resumed = four_ranks["cp2-resumed-stopped"], four_ranks["cp2-resumed"]
    assert stopped["exit"] == EXIT_STOPPED and max(stopped["losses"]) == 10
    assert sorted(resumed["losses"]) == list(range(11, 21))
    assert {**stopped["losses"], **resumed["losses"]} == four_ranks["cp2-fsdp"]["losses"]


def test_document_masking_composes_with_cp(four_ranks: dict[str, dict]) -> None:
    reference, got = four_ranks["docs-cp1"]["losses"], four_ranks["docs-cp2"]["losses"]
    assert sorted(got) == [1, 2, 3]
    for step, loss in reference.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), step


def test_only_counted_targets_weigh_the_loss_and_the_token_count_under_cp(four_ranks: dict[str, dict]) -> None:
    """Supervised fine-tuning data: the two halves of a sequence hold different numbers of response tokens, and
    the cp ranks' losses still make the whole sequence's mean; each response token is counted once."""
    reference, got = four_ranks["sft-cp1"], four_ranks["sft-cp2"]
    assert sorted(got["losses"]) == [1, 2, 3]
    for step, loss in reference["losses"].items():
        assert got["losses"][step] == pytest.approx(loss, rel=1e-5), step
    assert got["tokens"] == reference["tokens"] and 0 < got["tokens"] < 3 * 8 * 16


def test_a_cp_checkpoint_is_evaluated_on_one_process(four_ranks_at: tuple[Path, dict[str, dict]]) -> None:
    """launcher.evaluate runs whole sequences (forward only: cp=1) on whatever ranks it has."""
    root, _ = four_ranks_at
    out = run_module("launcher.evaluate", [str(root / "cp2-fsdp")], cwd=ROOT, env=launcher_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "evaluate: step 20: val/val/loss" in out.stdout + out.stderr
