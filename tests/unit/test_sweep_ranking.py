"""A sweep ranked by what was measured (issue 30, item 5; acceptance 5): points whose last training losses and
validation losses rank differently are ranked by validation, and launcher.status's table, its --json,
final_loss_vs_KEY.png and a local sweep's closing table say so; without validation the training loss averaged over
the last logged interval ranks them; --rank-by chooses any measured key (launcher/observe/ranking.py)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contract.rundir import metrics_file
from launcher import report, status
from launcher.observe import figures
from launcher.observe.runs import find_runs
from launcher.sweeps.summary import print_summary
from launcher.sweeps.sweepdir import Point, Sweep, save_sweep
from tests.unit.test_status import write_run
from tests.unit.test_status_validation import add_validation

LRS = ["1e-4", "3e-4", "1e-3", "3e-3"]
TRAIN = [1.0, 2.0, 3.0, 4.0]  # each point's last training loss: point 0 lowest
VAL = [3.5, 2.5, 1.5, math.nan]  # its last validation loss: point 2 best, point 3 diverged (never ranked)
BY_VAL = [2, 1, 0]


def make_sweep(root: Path, validation: bool = True, loss_avg: list[float] | None = None) -> Path:
    sweep_dir = root / "sweeps" / "ranked sweep"
    points = []
    for i, lr in enumerate(LRS):
        run_dir = root / f"point {i}"
        write_run(run_dir, name=f"point {i}", max_steps=30, losses=[5.0, 4.5, TRAIN[i]], lr=float(lr))
        if loss_avg is not None:
            rows = metrics_file.read_metrics(run_dir)
            rows[-1]["loss_avg"] = loss_avg[i]
            (run_dir / "metrics.jsonl").write_text("".join(metrics_file.encode_row(r) + "\n" for r in rows))
        if validation:
            add_validation(run_dir, {10: {"val": 4.0, "web": 9.0}, 30: {"val": VAL[i], "web": TRAIN[i]}})
        points.append(Point(i, [f"optim.lr={lr}"], str(run_dir), []))
    save_sweep(sweep_dir, Sweep("ranked sweep", "python -m launcher -m optim.lr=...", ["optim.lr"], points))
    return sweep_dir


def table_text(sweep_dir: Path, rank_by: str | None = None) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=250).print(status.snapshot(sweep_dir, find_runs(sweep_dir), rank_by=rank_by))
    return out.getvalue()


def row_order(text: str) -> list[int]:
    """The points of the table's rows, top to bottom (each labelled by its swept value)."""
    rows = [line for line in text.splitlines() if "optim.lr=" in line]
    return [i for line in rows for i, lr in enumerate(LRS) if f"optim.lr={lr} " in line]


def test_status_ranks_by_the_first_validation_loss_and_says_so(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = make_sweep(tmp_path)
    text = table_text(sweep_dir)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("rank"))
    assert "val/val/loss" in header
    assert "ranked by the first validation set's loss, val/val/loss (lower is better)" in text
    ranked = [line for line in text.splitlines() if "optim.lr=" in line]
    assert [line.split()[0] for line in ranked] == ["1", "2", "3", "-"]
    assert row_order(text) == [*BY_VAL, 3]
    assert status.main([str(sweep_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranked_by"] == {"metric": "val/val/loss", "words": "the first validation set's loss, val/val/loss",
                                "direction": "lower is better"}
    assert [(r["rank"], r["rank_value"]) for r in out["rows"]] == [(3, 3.5), (2, 2.5), (1, 1.5), (None, "nan")]


def test_the_final_value_plot_ranks_by_validation_and_says_so(tmp_path: Path) -> None:
    sweep_dir = make_sweep(tmp_path)
    target, title = report.load(sweep_dir)
    assert target.sweep is not None
    from launcher.observe.ranking import rank_runs

    ranked = rank_runs([run.run_dir for run in target.runs])
    points = figures.final_losses(target.sweep, target.runs, "optim.lr", ranked)
    assert [(p.value, p.loss) for p in points][:3] == [(lr, v) for lr, v in zip(LRS[:3], VAL[:3], strict=True)]
    ax = figures.final_loss_figure(points, "optim.lr", title, ranked).axes[0]
    assert ax.get_ylabel() == "final val/val/loss (lower is better)"
    assert "ranked by the first validation set's loss, val/val/loss (lower is better)" in ax.get_title()
    [star] = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([float(LRS[2])], [VAL[2]])
    assert "best" in [t.get_text() for t in ax.texts]
    assert report.main([str(sweep_dir)]) == 0
    assert (sweep_dir / "final_loss_vs_optim.lr.png").is_file()


def test_without_validation_the_interval_average_ranks_and_rank_by_chooses(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # loss_avg (the log interval's mean) ranks the points other than their last single-step loss does.
    sweep_dir = make_sweep(tmp_path, validation=False, loss_avg=[2.8, 2.6, 2.4, 2.2])
    text = table_text(sweep_dir)
    assert ("ranked by the training loss averaged over the last logged interval (no run has a validation loss) "
            "(lower is better)") in text
    assert "train loss (avg)" in text
    assert row_order(text) == [3, 2, 1, 0]
    assert row_order(table_text(sweep_dir, rank_by="loss")) == [0, 1, 2, 3]  # the last logged loss, as asked
    # A metric no run measured suggests only what they measured (it said "e.g. val/val/loss" to runs that never
    # validated, and asked a metric they never measured for its direction: harness/t/novelty:max).
    assert status.main([str(sweep_dir), "--rank-by", "val/val/loss"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rank-by val/val/loss: no run measured val/val/loss: name one they measured (" \
        in err and "loss_avg" in err and "e.g. val/val/loss" not in err, err
    assert status.main([str(sweep_dir), "--rank-by", "harness/t/novelty"]) == 2
    err = capsys.readouterr().err
    assert "no run measured harness/t/novelty" in err and ":max" not in err, err
    assert status.main([str(sweep_dir), "--rank-by", "loss_avgg"]) == 2
    assert "no run measured loss_avgg: did you mean --rank-by loss_avg?" in capsys.readouterr().err
    assert status.main([str(sweep_dir), "--rank-by", "lr"]) == 2  # measured, of no known direction: say which
    assert "--rank-by=lr:max or --rank-by=lr:min" in capsys.readouterr().err
    assert report.main([str(tmp_path / "point 0"), "--rank-by", "loss"]) == 2
    assert "ranks a sweep's points" in capsys.readouterr().err


def test_a_chosen_metric_ranks_a_validation_sweep_too(tmp_path: Path) -> None:
    sweep_dir = make_sweep(tmp_path)
    # val/web/loss is the last training loss here: ranked by it, point 0 leads.
    assert row_order(table_text(sweep_dir, rank_by="val/web/loss")) == [0, 1, 2, 3]
    assert "ranked by val/web/loss (lower is better)" in table_text(sweep_dir, rank_by="val/web/loss")


def test_a_local_sweeps_closing_table_ranks_by_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = make_sweep(tmp_path)
    points: list[Any] = [SimpleNamespace(run_dir=tmp_path / f"point {i}", point=SimpleNamespace(index=i),
                                         label=f"optim.lr={lr}", action="run",
                                         cfg=SimpleNamespace(trainer=SimpleNamespace(max_steps=30)))
                         for i, lr in enumerate(LRS)]
    print_summary(points, {i: 0 for i in range(4)}, sweep_dir)
    err = capsys.readouterr().err
    assert "ranked by the first validation set's loss, val/val/loss (lower is better)" in err
    rows = [line for line in err.splitlines() if "optim.lr=" in line]
    assert row_order(err) == [*BY_VAL, 3]
    assert f"{TRAIN[2]:.4f}" in rows[0] and f"{VAL[2]:.4f}" in rows[0]  # the final loss and the ranked value
