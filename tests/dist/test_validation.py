"""In-loop validation (eval.*) on 2 CPU ranks: the logged validation loss equals a single-process evaluation of
the same weights on the same samples, and a run with validation trains bitwise like one without (dropout on, so
a pass that drew from the training RNG or left the model in eval mode would show). A run resumed at a validated
step (a stop, a periodic checkpoint, a restart before the first checkpoint, max_steps raised) validates each step
once: one row per step, no pass repeated, the losses of an uninterrupted run."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from contract.errors import EXIT_STOPPED
from contract.rules.eval_sets import HELD_OUT_START
from launcher.compose import compose_and_plan
from tests.conftest import hq, launch, read_metrics
from tests.dist.store import hosted_port
from tests.dist.workers import train_and_dump_full_model
from train.data.synthetic import SyntheticTokens
from train.model.build import build_model, logits_of

pytestmark = pytest.mark.dist

STEPS, EVERY, BATCHES = 4, 2, 2
COMMON = ["model.d_model=32", "model.n_layers=1", "model.ffn_hidden=64", "model.tie_embeddings=false", "model.dropout=0.1", "data.seq_len=16",
          "trainer.micro_batch_size=2", "trainer.global_batch_size=8", f"trainer.max_steps={STEPS}",
          "trainer.ckpt_every=0"]
EVAL = [f"eval.every={EVERY}", f"eval.batches={BATCHES}", "eval.at_start=true"]
LAYOUTS = {"ddp": ["strategy=ddp"], "fsdp": ["strategy=fsdp"], "tp2": ["strategy=fsdp", "parallel.tp=2"],
           "pp2": ["strategy=ddp", "parallel.pp=2", "model.n_layers=2", "trainer.micro_batch_size=1"], "zero2": ["strategy=zero2"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("validation")
    configs = {}
    for name, layout in LAYOUTS.items():
        configs[f"{name}-eval"] = [*COMMON, *layout, *EVAL]
        configs[f"{name}-plain"] = [*COMMON, *layout]
    mp.spawn(train_and_dump_full_model, args=(2, hosted_port(2), str(out), configs), nprocs=2)
    return out


def _single_process_loss(state: dict[str, torch.Tensor], model_keys: list[str]) -> float:
    """The held-out synthetic set's first BATCHES x global batch samples, all at once, in one process."""
    cfg, _ = compose_and_plan(["local.nproc=1", "strategy=single", *COMMON, *model_keys])
    model = build_model(cfg.model)
    model.load_state_dict(state)
    model.eval()
    source = SyntheticTokens(cfg.model.vocab_size, cfg.data.seq_len, cfg.data.seed, cfg.data.signal)
    tokens = torch.from_numpy(source.sample_batch(range(HELD_OUT_START, HELD_OUT_START + BATCHES * 8)))
    with torch.no_grad():
        logits = logits_of(model(tokens[:, :-1]))
    return float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_validation_loss_is_the_single_process_loss_and_training_is_unchanged(runs: Path, layout: str) -> None:
    with_eval, plain = runs / f"{layout}-eval", runs / f"{layout}-plain"
    ref = torch.load(with_eval / "reference.pt", weights_only=False)
    rows = {r["step"]: r for r in read_metrics(with_eval)}
    assert [s for s, r in sorted(rows.items()) if "val/val/loss" in r] == [0, 2, 4]  # at start, every 2, the end
    final = rows[STEPS]
    state = ref.get("state")
    if state is None:  # a pipeline's stages or a ZeRO engine: the whole model from the final checkpoint
        from train.weights.export import load_model_state

        state = load_model_state(with_eval / "checkpoints" / f"step_{STEPS}")
    expected = _single_process_loss(state, [o for o in LAYOUTS[layout] if o.startswith("model.")])
    assert final["val/val/loss"] == pytest.approx(expected, rel=1e-5)
    assert final["val/val/ppl"] == pytest.approx(math.exp(expected), rel=1e-5)
    # Bitwise: the same training losses with validation as without.
    plain_ref = torch.load(plain / "reference.pt", weights_only=False)
    assert ref["losses"] == plain_ref["losses"] and len(ref["losses"]) == STEPS
    assert not any("val/val/loss" in r for r in read_metrics(plain))


PASS = re.compile(r"\[rank 0/2 [^]]*\] validation: val/val/loss")  # rank 0's line of each pass


def _passes(out: str) -> int:
    return len(PASS.findall(out))


def _resumable(run_root: Path, max_steps: int = 30) -> list[str]:
    return [*[o for o in COMMON if not o.startswith("trainer.")], "trainer.micro_batch_size=2",
            "trainer.global_batch_size=8", f"trainer.max_steps={max_steps}", "trainer.ckpt_every=10",
            # Synchronous: a fault a few steps after a periodic save resumes from that save, however loaded the
            # machine (an asynchronous one may not have completed yet; a resume from the one before is then right).
            "checkpoint.async_save=false",
            "trainer.log_every=1", "eval.every=10", f"eval.batches={BATCHES}", "eval.at_start=true", "local.nproc=2",
            "logger.backend=none", f"run.root={hq(run_root)}"]


def _by_step(rows: list[dict]) -> dict[int, tuple[float | None, float | None]]:
    return {r["step"]: (r.get("loss"), r.get("val/val/loss")) for r in rows}


def test_a_requeued_run_validates_each_step_once_with_the_losses_of_an_uninterrupted_one(run_root: Path) -> None:
    whole = launch(*_resumable(run_root), "run.name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert _passes(whole.stderr) == 4  # steps 0, 10, 20, 30
    # 1: dies in step 3, before its first checkpoint (the restart keeps the step-0 row); 2: stops as on preemption at
    # step 10, a validated step; 3: dies in step 25, so 4 resumes from the periodic checkpoint of step 20.
    faults = [{"SLURMTRAIN_TEST_RAISE": "0:3"}, {"SLURMTRAIN_TEST_SIGNAL": "10:1"}, {"SLURMTRAIN_TEST_RAISE": "1:25"},
              {}]
    attempts = [launch(*_resumable(run_root), "run.name=split", **fault) for fault in faults]
    codes = [a.returncode for a in attempts]
    assert codes[1:4:2] == [EXIT_STOPPED, 0] and not {codes[0], codes[2]} & {0, EXIT_STOPPED}, \
        [a.stderr[-2000:] for a in attempts]
    assert "resumed from" in attempts[3].stderr and "step 20," in attempts[3].stderr
    # Each attempt ran the passes of the steps it reached first: 0; 10; 20; 30.
    assert [_passes(a.stderr) for a in attempts] == [1, 1, 1, 1], attempts[3].stderr[-3000:]
    rows = read_metrics(run_root / "split")
    assert [r["step"] for r in rows] == list(range(0, 31))  # one row per step
    assert _by_step(rows) == _by_step(read_metrics(run_root / "whole"))  # float equality: bitwise
    assert not any("tokens_per_s" in r for r in rows if "loss" not in r)  # the step-0 row measured no throughput


def test_raising_max_steps_does_not_validate_the_old_end_again(run_root: Path) -> None:
    first = launch(*_resumable(run_root, max_steps=20), "run.name=longer")
    assert first.returncode == 0 and _passes(first.stderr) == 3, first.stderr[-3000:]  # 0, 10, 20
    second = launch(*_resumable(run_root, max_steps=30), "run.name=longer")
    assert second.returncode == 0 and _passes(second.stderr) == 1, second.stderr[-3000:]  # 30 only
    rows = read_metrics(run_root / "longer")
    assert [r["step"] for r in rows] == list(range(0, 31))
    assert [r["step"] for r in rows if "val/val/loss" in r] == [0, 10, 20, 30]
