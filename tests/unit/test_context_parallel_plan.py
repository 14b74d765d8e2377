"""parallel.cp in the launch plan (issue 37 item 6, acceptance 5): the layout and memory it shows, and the
configurations it refuses, each in one line with exit 2 and nothing created. `python -m launcher` runs forked from a
process that imported it already (tests/forked_cli.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.compose import compose_and_plan
from tests.conftest import ROOT, hq, launcher_env
from tests.forked_cli import run_module


def launch(*overrides: str) -> subprocess.CompletedProcess[str]:
    return run_module("launcher", list(overrides), cwd=ROOT, env=launcher_env())


H100X64 = ["+cluster=h100x64", "model=llama3_70b", "strategy=fsdp", "trainer.micro_batch_size=1",
           "model.max_seq_len=8192"]


@pytest.mark.parametrize("checkpointing", ["true", "false"])
def test_cp_divides_the_activations_and_the_data_parallel_size(checkpointing: str) -> None:
    common = [*H100X64, f"strategy.activation_checkpointing={checkpointing}", "launcher.force=true"]
    _, alone = compose_and_plan(common)
    _, split = compose_and_plan([*common, "parallel.cp=4"])
    assert alone.fit is not None and split.fit is not None
    whole, quarter = alone.fit.estimate.activations, split.fit.estimate.activations
    if checkpointing == "true":  # each block keeps its input only: a quarter of every sequence's tokens
        # ... and the loss: 8,192 tokens of Llama 3's vocabulary run chunked (no fp32 log-softmax kept), a quarter
        # of them runs plain, keeping its fp32 log-softmax (contract/rules/loss_chunks.py)
        from contract.rules.loss_chunks import chunk_rows

        assert chunk_rows(8192, 128256) is not None and chunk_rows(2048, 128256) is None
        assert quarter == pytest.approx(whole / 4 + 4 * 2048 * 128256, rel=1e-9)
    else:  # and each layer keeps the other ranks' keys and values for its backward
        assert whole / 4 < quarter < whole / 3
    assert split.fit.estimate.params == pytest.approx(alone.fit.estimate.params)  # fsdp over dp x cp: the same
    assert (alone.data_parallel, split.data_parallel) == (64, 16)
    assert any("context-parallel 4: each sequence in 8 chunks" in line for line in split.layout_lines)


def test_the_plan_shows_cp_with_tp_on_every_node(tmp_path: Path) -> None:
    out = launch("model=tiny", "model.tie_embeddings=false", "local.nproc=4", "parallel.tp=2", "parallel.cp=2",
                 "strategy=fsdp", "launcher.dry_run=true", f"run.root={hq(tmp_path)}")
    assert out.returncode == 0, out.stderr
    assert "layout: tensor-parallel 2 x pipeline 1 x context-parallel 2 x data-parallel 1 = 4 ranks" in out.stderr
    assert "dp 0 cp 0 stage 0 tp 0-1; dp 0 cp 1 stage 0 tp 0-1" in out.stderr


@pytest.mark.parametrize(("overrides", "expected"), [
    (["local.nproc=2", "strategy=fsdp", "data.seq_len=62"],
     "error: data.seq_len=62 does not split into 2 x parallel.cp = 4 equal chunks"),
    (["local.nproc=3", "strategy=fsdp"], "error: parallel.tp=1 x parallel.pp=1 x parallel.cp=2 = 2 does not divide"),
    (["local.nproc=2", "strategy=zero2"], "error: parallel.tp/pp/cp compose with FSDP, HSDP or DDP, not strategy=zero2"),
    (["local.nproc=4", "strategy=ddp", "parallel.tp=2", "model.tie_embeddings=false"],
     "error: strategy=ddp does not compose with parallel.tp/pp and parallel.cp=2"),
    (["local.nproc=2", "strategy=fsdp", "eval.async_jobs=true"], "error: eval.async_jobs=true with parallel.cp=2"),
    (["local.nproc=2", "strategy=ddp", "model._target_=tests.fixtures.user_models.ScaledLM",
      "+model.args.vocab_size=256"], "error: parallel.cp needs slurmtrain's transformer"),
], ids=["odd-chunks", "world", "deepspeed", "ddp-tp", "eval-jobs", "own-model"])
def test_bad_cp_configs_are_refused_in_one_line(tmp_path: Path, overrides: list[str], expected: str) -> None:
    out = launch("model=tiny", "parallel.cp=2", *overrides, f"run.root={hq(tmp_path / 'runs')}")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(expected), lines[0]
    assert list(tmp_path.iterdir()) == []


def test_head_and_tail_chunks_cover_the_sequence_once_with_even_causal_work() -> None:
    import torch

    from train.strategies.context_parallel import chunk_positions, gathered_positions

    for cp in (1, 2, 4):
        held = [chunk_positions(64, cp, r) for r in range(cp)]
        assert torch.equal(torch.cat(held).sort().values, torch.arange(64))
        assert torch.equal(torch.cat(held), gathered_positions(64, cp))
        work = {int((p + 1).sum()) for p in held}  # keys each rank's queries attend to
        assert len(work) == 1, (cp, work)
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
