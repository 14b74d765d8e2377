"""The launch plan's learning-rate line: the schedule over the run, and, when the run resumes from a checkpoint (an
extended run above all), what the rate does across the old and new steps, from the checkpoint's own config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.compose import compose_and_plan
from launcher.run.rundir import config_yaml


def _checkpoint(root: Path, step: int, *overrides: str) -> None:
    """A run directory `run` whose newest complete checkpoint, at `step`, was trained with `overrides`."""
    cfg, _ = compose_and_plan([f"run.root={root}", "run.name=run", *overrides])
    ckpt = root / "run" / "checkpoints" / f"step_{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "config.yaml").write_text(config_yaml(OmegaConf.to_container(cfg, resolve=True)))  # type: ignore[arg-type]
    (ckpt / "COMPLETE").write_text(json.dumps({"step": step, "world_size": 1}))


def _lines(root: Path, *overrides: str) -> list[str]:
    _, plan = compose_and_plan([f"run.root={root}", "run.name=run", *overrides])
    return [line.strip() for line in plan.summary().splitlines()
            if line.strip().startswith(("learning rate", "resumes after"))]


WSD = ("optim.schedule=wsd",)
CASES = [
    # (trained with, checkpoint step, resumed with, the plan's resume line)
    ((*WSD, "optim.decay_start_step=100", "trainer.max_steps=100"), 100,
     (*WSD, "optim.decay_start_step=200", "trainer.max_steps=300"),
     "resumes after step 100 of 300 (trained so far for trainer.max_steps=100): stable phase extended, decay from "
     "step 200 (was 100); step 101 trains at 0.003 (step 100 trained at 0.003)"),
    ((*WSD, "trainer.max_steps=100"), 100, (*WSD, "trainer.max_steps=150"),
     "resumes after step 100 of 150 (trained so far for trainer.max_steps=100): decay moved to step 120 (was 80), "
     "but steps 81-100 already decayed: the rate goes back up, it is not a stable phase extended; step 101 trains at "
     "0.003 (step 100 trained at 0.0003)"),
    ((*WSD, "optim.decay_start_step=10", "trainer.max_steps=20"), 20,
     (*WSD, "optim.decay_start_step=15", "trainer.max_steps=25"),
     "resumes after step 20 of 25 (trained so far for trainer.max_steps=20): decay moved to step 15 (was 10), but "
     "steps 11-20 already decayed: the rate goes back up, it is not a stable phase extended; step 21 trains at "
     "0.0009086 (step 20 trained at 0.0003)"),
    ((*WSD, "optim.decay_start_step=100", "trainer.max_steps=120"), 110,
     (*WSD, "optim.decay_start_step=100", "trainer.max_steps=200"),
     "resumes after step 110 of 200 (trained so far for trainer.max_steps=120): decay from step 100 re-stretched to "
     "end at step 200 (was 120); step 111 trains at 0.002105 (step 110 trained at 0.001091)"),
    ((*WSD, "optim.decay_start_step=100", "trainer.max_steps=200"), 60,
     (*WSD, "optim.decay_start_step=50", "trainer.max_steps=200"),
     "resumes after step 60 of 200 (trained so far for trainer.max_steps=200): decay moved earlier, from step 50 "
     "(was 100); step 61 trains at 0.002269 (step 60 trained at 0.003)"),
    (("optim.schedule=constant", "trainer.max_steps=100"), 100, ("optim.schedule=constant", "trainer.max_steps=150"),
     "resumes after step 100 of 150 (trained so far for trainer.max_steps=100): constant does not depend on "
     "trainer.max_steps: the rates are unchanged; step 101 trains at 0.003 (step 100 trained at 0.003)"),
    (("optim.schedule=linear", "trainer.max_steps=100"), 100, ("optim.schedule=linear", "trainer.max_steps=200"),
     "resumes after step 100 of 200 (trained so far for trainer.max_steps=100): linear decay re-stretched to end at "
     "step 200 (was 100); step 101 trains at 0.001671 (step 100 trained at 0.0003)"),
    (("trainer.max_steps=100",), 40, ("trainer.max_steps=100",), "resumes after step 40: step 41 trains at 0.002192"),
]


@pytest.mark.parametrize(("trained", "step", "resumed", "expected"), CASES, ids=[c[3][:40] for c in CASES])
def test_the_plan_says_what_the_rate_does_across_a_resume(tmp_path: Path, trained: tuple[str, ...], step: int,
                                                          resumed: tuple[str, ...], expected: str) -> None:
    _checkpoint(tmp_path, step, *trained)
    lines = _lines(tmp_path, *resumed)
    assert lines[1:] == [expected], lines


def test_the_plan_names_the_schedule_and_leaves_the_resume_out_when_nothing_resumes(tmp_path: Path) -> None:
    assert _lines(tmp_path, *WSD) == ["learning rate 0.003 (optim.lr, no scaling); wsd schedule: warmup 5 steps, "
                                      "stable to step 80, 1-sqrt decay to 0.0003 at step 100"]
    _checkpoint(tmp_path, 50)
    assert len(_lines(tmp_path)) == 2
    assert len(_lines(tmp_path, "run.overwrite=true")) == 1 == len(_lines(tmp_path, "run.resume=false"))


def test_the_cosine_plan_names_the_rate_the_last_step_trains_at_not_the_floor_it_reaches_after(tmp_path: Path) -> None:
    from contract.rules.schedules import cosine_factor

    line = _lines(tmp_path, "trainer.max_steps=100")[0]
    last = 0.003 * cosine_factor(99, 5, 100, 0.1)  # the rate step 100 trains at (metrics.jsonl's lr)
    assert last > 0.0003
    assert line.endswith(f"cosine decay toward 0.0003, step 100 trains at {last:.4g}"), line
