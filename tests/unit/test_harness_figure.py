"""launcher.report's harness.png (issue 36, item 8): each validation set of a run keeps its own dash pattern on the
loss axis, as loss.png draws them, and a multiple-choice task's panel has its chance line, at the level the
evaluation recorded (harness/TASK/chance), which is no score of its own."""

from __future__ import annotations

import json
from pathlib import Path

from contract.rules.harness import describe
from contract.rundir import harness_scores
from launcher.observe.figures import VALIDATION_STYLES
from launcher.observe.harness_figure import harness_figure
from launcher.observe.runs import RunRef
from train.evaluation.harness import chance_levels


def _run(root: Path) -> Path:
    rows = [{"step": step, "val/web/loss": 3.0 - step / 100, "val/code/loss": 2.5 - step / 200,
             "harness/pattern/acc": 0.3 + step / 1000, "harness/pattern/acc_stderr": 0.02,
             "harness/pattern/chance": 0.25} for step in (10, 20, 30)]
    root.mkdir()
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_each_validation_set_has_its_own_dash_and_the_panel_a_chance_line(tmp_path: Path) -> None:
    run = _run(tmp_path / "r")
    fig = harness_figure([RunRef("r", run)], "t")
    assert fig is not None
    score_ax, loss_ax = fig.axes[0], fig.axes[1]
    styles = {line.get_gid(): line.get_linestyle() for line in loss_ax.get_lines()}
    assert set(styles) == {"r val/code", "r val/web"} and len(set(styles.values())) == 2, styles
    chance = [line for line in score_ax.get_lines() if line.get_gid() == "chance"]
    assert len(chance) == 1 and set(chance[0].get_ydata()) == {0.25}
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "chance (0.25)" in legend and "val/code" in legend and "val/web" in legend, legend
    assert VALIDATION_STYLES[0] != VALIDATION_STYLES[1]


def test_chance_is_no_score() -> None:
    row = {"harness/pattern/acc": 0.5, "harness/pattern/chance": 0.25}
    assert describe(row) == "pattern/acc 0.5000"


def test_chance_comes_from_the_choices_each_document_had(tmp_path: Path) -> None:
    samples = [{"arguments": [("q", " a"), ("q", " b")]}, {"arguments": [("q", c) for c in "abcd"]}]
    out = {"configs": {"mc": {"output_type": "multiple_choice"}, "gen": {"output_type": "generate_until"}},
           "samples": {"mc": samples, "gen": [{"arguments": [("q", {})]}]}}
    assert chance_levels(out) == {"harness/mc/chance": (1 / 2 + 1 / 4) / 2}
    curves = harness_scores.curves(_run(tmp_path / "r"))
    assert list(curves) == ["pattern"] and list(curves["pattern"]) == ["acc"]  # chance is no curve
    assert harness_scores.chance(tmp_path / "r") == {"pattern": 0.25}
