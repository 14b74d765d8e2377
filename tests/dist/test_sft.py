"""Supervised fine-tuning data trained (issue 31, item 4): a tiny model learns "shift: abc" -> "bcd" from prompt/
response records rendered with a chat template written here, and greedy `launcher.sample --chat` answers prompts it
never saw; the loss mask goes where the labels go under every strategy (ddp, fsdp, tp=2, pp=2 reach the single
process's losses) and `tokens` counts the response tokens the steps trained."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from launcher.prepare.__main__ import main as prepare_main
from launcher.sample import main as sample_main
from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics
from tests.dist.store import hosted_port
from tests.dist.workers import train_several
from tests.sft_data import HELD_OUT, shift, shift_records, write_tokenizer
from train.data.batches import IGNORE_INDEX, load_micro_batch
from train.data.sources import build_source

pytestmark = pytest.mark.dist

VOCAB = 20  # the test tokenizer's 3 special tokens and 17 characters


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sft data")
    tok = write_tokenizer(root / "chat tok")
    shift_records(root / "pairs.jsonl", 3000)
    assert prepare_main([str(root / "pairs.jsonl"), "--out", str(root / "shift data"), "--tokenizer", str(tok),
                         "--prompt-field", "prompt", "--response-field", "response", "--val-fraction", "0.02"]) == 0
    return root / "shift data"


def test_a_tiny_model_learns_the_pattern_and_sample_chat_answers_held_out_prompts(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Padded records start at position 0, so learned positions find "the k-th letter" at once (by step 100 for
    # each of three seeds tried; rope took 200 to 400 steps, depending on the seed).
    out = launch("model=tiny", "model.position=learned", "data=tokens", f"data.path={hq(data)}",
                 f"model.vocab_size={VOCAB}", "data.seq_len=18", "data.sft_layout=padded", "trainer.max_steps=150",
                 "trainer.micro_batch_size=32", "optim.lr=3e-3", "optim.schedule=constant", "optim.weight_decay=0",
                 "trainer.ckpt_every=0", "trainer.log_every=50", "eval.every=150", "logger.backend=none",
                 f"run.root={hq(tmp_path)}", "run.name=shift")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "only response tokens count" in out.stdout + out.stderr
    last = read_metrics(tmp_path / "shift")[-1]
    assert last["val/val/loss"] < 0.05, last
    # the first as a user runs it (a process of its own), the others through its main() here (torch imported once)
    first = subprocess.run([sys.executable, "-m", "launcher.sample", str(tmp_path / "shift"), "--chat", "--prompt",
                            f"shift: {HELD_OUT[0]}"], capture_output=True, text=True, env=launcher_env(), cwd=ROOT,
                           timeout=300)
    assert first.returncode == 0 and first.stdout == shift(HELD_OUT[0]) + "\n", (first.stdout, first.stderr)
    for word in HELD_OUT[1:]:
        assert sample_main([str(tmp_path / "shift"), "--chat", "--prompt", f"shift: {word}"]) == 0
        assert capsys.readouterr().out == shift(word) + "\n", word


def _spawn(tmp_path: Path, world: int, runs: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    mp.spawn(train_several, args=(world, hosted_port(world), str(tmp_path), runs), nprocs=world)
    return {name: torch.load(tmp_path / name / "losses_rank0.pt") for name in runs}


def test_every_strategy_trains_only_the_responses_and_counts_them(data: Path, tmp_path: Path) -> None:
    """Micro batches of one sample, so every layout averages the same per-sample losses as the single process."""
    common = ["model=tiny", "data=tokens", f"data.path={hq(data)}", f"model.vocab_size={VOCAB}", "data.seq_len=16",
              "model.tie_embeddings=false", "trainer.global_batch_size=16", "trainer.micro_batch_size=1",
              "trainer.max_steps=4", "trainer.ckpt_every=0", "precision=fp32"]
    reference = _spawn(tmp_path / "one", 1, {"single": [*common, "strategy=single"]})["single"]
    runs = {"ddp": ["strategy=ddp"], "fsdp": ["strategy=fsdp"], "tp2": ["strategy=fsdp", "parallel.tp=2"],
            "pp2": ["strategy=fsdp", "parallel.pp=2"]}
    if importlib.util.find_spec("deepspeed") is not None:
        runs["zero2"] = ["strategy=zero2"]
    two = _spawn(tmp_path / "two", 2, {name: [*common, *extra] for name, extra in runs.items()})
    cfg = OmegaConf.create({"name": "tokens", "path": str(data), "dtype": "uint16", "seq_len": 16, "seed": 1234,
                            "shuffle": True, "sources": {}, "sft_layout": "packed"})
    _, targets = load_micro_batch(build_source(cfg, VOCAB), list(range(4 * 16)))
    responses = int((targets != IGNORE_INDEX).sum())
    assert 0 < responses < targets.numel()
    assert reference[4] < reference[1]  # it learns
    for name, losses in {"single": reference, **two}.items():
        assert losses == pytest.approx(reference, rel=1e-4), (name, losses, reference)
        metrics = read_metrics(tmp_path / ("one" if name == "single" else "two") / name)
        assert metrics[-1]["step"] == 4 and metrics[-1]["tokens"] == responses, (name, metrics[-1])
