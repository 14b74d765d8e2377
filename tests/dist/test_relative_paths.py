"""A run launched with relative paths (data prepared by launcher.prepare, model.init_from, an evaluation set, run.root)
from one directory is used from another: launcher.sample, launcher.status and launcher.worker --evaluate find
everything, config.yaml holds absolute paths, and the command in command.txt replays from anywhere."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import launch, launcher_env

pytestmark = pytest.mark.dist

RUN = ["data=tokens", "data.path=data/prep", "model.vocab_size=257", "logger.backend=none", "run.root=runs"]
TUNED = [*RUN, "model.init_from=runs/base", "run.name=tuned", "trainer.max_steps=4", "trainer.ckpt_every=2",
         "eval.every=2", "eval.sets.held.kind=val", "eval.sets.held.path=data/prep"]


def run_module(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=launcher_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the launch directory, another directory); the tuned run trained from the first."""
    top = tmp_path_factory.mktemp("relative")
    here, elsewhere = top / "launch dir's", top / "elsewhere"
    (here / "corpus").mkdir(parents=True)
    elsewhere.mkdir()
    for i in range(12):
        (here / "corpus" / f"doc{i}.txt").write_text(f"the quick brown fox {i} jumps over the lazy dog. " * 40)
    out = run_module(here, "launcher.prepare", "corpus/*.txt", "--out", "data/prep", "--tokenizer", "bytes",
                     "--val-fraction", "0.25")
    assert out.returncode == 0, out.stderr[-2000:]
    for overrides in ([*RUN, "run.name=base", "trainer.max_steps=2"], TUNED):
        out = launch(*overrides, cwd=here)
        assert out.returncode == 0, out.stderr[-3000:]
    return here, elsewhere


def test_config_holds_absolute_paths(dirs: tuple[Path, Path]) -> None:
    here, _ = dirs
    saved = yaml.safe_load((here / "runs" / "tuned" / "config.yaml").read_text())
    assert saved["data"]["path"] == str(here / "data" / "prep")
    assert saved["model"]["init_from"] == str(here / "runs" / "base")
    assert saved["eval"]["sets"]["held"]["path"] == str(here / "data" / "prep")
    assert saved["run"]["root"] == str(here / "runs")


def test_sample_status_and_evaluate_from_another_directory(dirs: tuple[Path, Path]) -> None:
    here, elsewhere = dirs
    run_dir = Path("..") / here.name / "runs" / "tuned"  # as typed from elsewhere
    out = run_module(elsewhere, "launcher.sample", str(run_dir), "--prompt", "the quick", "--max-new-tokens", "4")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("the quick") and "tokenizer bytes" in out.stderr
    out = run_module(elsewhere, "launcher.status", str(run_dir.parent), "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)["rows"]}
    assert rows["tuned"]["step"] == 4 and rows["tuned"]["state"] == "finished"
    out = run_module(elsewhere, "launcher.worker", "--evaluate", str(run_dir), "4")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((here / "runs" / "tuned" / "eval" / "step_4.json").read_text())
    assert "val/held/loss" in json.dumps(result)


def test_the_recorded_command_replays_from_anywhere(dirs: tuple[Path, Path]) -> None:
    here, elsewhere = dirs
    line = (here / "runs" / "tuned" / "command.txt").read_text().splitlines()[-1]
    assert shlex.split(line)[:3] == ["cd", str(here), "&&"]
    out = subprocess.run(["bash", "-c", line], cwd=elsewhere, env=launcher_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{here / 'runs' / 'tuned'} is already at step 4" in out.stderr  # the same run, its data found


def test_each_point_of_a_sweep_reads_absolute_paths(dirs: tuple[Path, Path]) -> None:
    here, _ = dirs
    out = launch("-m", *RUN, "trainer.max_steps=1", "optim.lr=1e-3,2e-3", "launcher.sweep_name=lrs", cwd=here)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = json.loads((here / "runs" / "sweeps" / "lrs" / "sweep.json").read_text())
    assert shlex.split(sweep["command"])[:3] == ["cd", str(here), "&&"]
    assert len(sweep["points"]) == 2
    for point in sweep["points"]:
        saved = yaml.safe_load((Path(point["run_dir"]) / "config.yaml").read_text())
        assert saved["data"]["path"] == str(here / "data" / "prep") and saved["run"]["root"] == str(here / "runs")
        assert (Path(point["run_dir"]) / "command.txt").read_text().startswith(f"cd {shlex.quote(str(here))} && ")
