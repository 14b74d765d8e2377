"""Sweep logic that needs no cluster: names, swept keys, per-shape arrays in a dry run, refusals before submission."""

from __future__ import annotations

import re
from pathlib import Path

from launcher.sweeps.sweep import sweep_name
from launcher.sweeps.sweep_run import swept_keys
from tests.conftest import hq, launch


def test_sweep_name_is_stable_under_reordering_and_launcher_options() -> None:
    a = sweep_name(None, ["optim.lr=1e-4,3e-4", "+cluster=a100x16", "strategy=ddp,fsdp"])
    b = sweep_name(None, ["strategy=ddp,fsdp", "optim.lr=1e-4,3e-4", "+cluster=a100x16", "launcher.wait=true"])
    assert a == b and re.fullmatch(r"sweep-[0-9a-f]{8}", a)
    assert sweep_name(None, ["optim.lr=1e-4,3e-3"]) != sweep_name(None, ["optim.lr=1e-4,3e-4"])
    assert sweep_name("lr-scan", ["optim.lr=1e-4,3e-4"]) == "lr-scan"


def test_swept_keys_are_the_sweep_overrides_only() -> None:
    assert swept_keys(["optim.lr=1e-4,3e-4", "trainer.max_steps=50", "strategy=ddp,fsdp",
                       "trainer.seed=range(1,4)", "+cluster=local_slurm"]) == ["optim.lr", "strategy", "trainer.seed"]


def test_dry_run_makes_one_array_per_resource_shape_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "r o"
    out = launch("-m", "optim.lr=1e-4,3e-4", "cluster.nodes=1,2", "+cluster=a100x16", "launcher.dry_run=true",
                 f"run.root={hq(root)}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    arrays = re.findall(r"#SBATCH --array=(\S+)", out.stdout)
    assert arrays == ["0-1%2", "0-1%2"]
    assert re.findall(r"#SBATCH --nodes=(\d+)", out.stdout) == ["1", "2"]
    assert "this array would run points 0, 2" in out.stderr and "this array would run points 1, 3" in out.stderr
    assert "2 array(s), one per resource shape" in out.stderr
    assert not root.exists() or not any(root.rglob("*.json"))
    assert not any(root.rglob("config.yaml")) if root.exists() else True


def test_points_sharing_a_run_directory_are_refused(tmp_path: Path) -> None:
    # trainer.max_steps does not change what is trained, so both points would land in one run directory.
    out = launch("-m", "trainer.max_steps=10,20", "+cluster=a100x16", "launcher.dry_run=true",
                 f"run.root={hq(tmp_path)}", cwd=tmp_path)
    assert out.returncode == 2
    assert "sweep points 0 (trainer.max_steps=10) and 1 (trainer.max_steps=20) would train in the same run " \
           "directory" in out.stderr
    assert "sweep a setting that changes training" in out.stderr


def test_invalid_point_is_named_and_nothing_is_created(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    out = launch("-m", "trainer.global_batch_size=16,20,24", "local.nproc=2", f"run.root={hq(root)}", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sweep point 1 (trainer.global_batch_size=20): ")
    assert not root.exists()


def test_each_point_is_the_config_its_own_single_run_command_composes(tmp_path: Path) -> None:
    """Points share one Hydra composition per config-group choice and get their value overrides applied to a
    copy: the result must train exactly what the single-run command of that point trains (same run directory,
    whose name hashes every training setting)."""
    from launcher.compose import compose_and_plan

    root = tmp_path / "runs"
    swept = ["strategy=ddp,fsdp", "optim.lr=1e-3,2e-3", "model.n_layers=1,3"]
    fixed = ["+cluster=a100x16", "trainer.max_steps=7", "data.seq_len=32", f"run.root={root}"]
    out = launch("-m", *swept, *fixed, "launcher.dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = re.findall(r"point (\d+): (.+)\n\s+starts; run directory (.+)", out.stderr)
    assert len(printed) == 8
    names = set()
    for _, label, run_dir in printed:
        _, plan = compose_and_plan([*label.split(), *fixed])
        assert str(plan.run_dir) == run_dir, label
        names.add(Path(run_dir).name)
    assert len(names) == 8


def test_a_sweep_point_logs_to_its_own_wandb_run_grouped_by_the_sweep(monkeypatch, tmp_path: Path) -> None:
    import sys
    import types

    from launcher.compose import compose_config
    from train.observe.metrics import _init_wandb

    calls: list[dict] = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw)))
    cfg = compose_config(["logger.group=sweep-1234abcd", "run.name=p0"])
    _init_wandb(cfg, tmp_path, "runid1", {})
    assert calls[0]["group"] == "sweep-1234abcd" and calls[0]["id"] == "runid1" and calls[0]["name"] == "p0"
    assert calls[0]["resume"] == "allow"


def test_batches_do_not_split_the_checks(tmp_path: Path) -> None:
    # hydra.sweeper.max_batch_size would check and launch batch by batch; a training sweep ignores it.
    root = tmp_path / "runs"
    out = launch("-m", "trainer.global_batch_size=16,32,20", "local.nproc=2", "hydra.sweeper.max_batch_size=1",
                 f"run.root={hq(root)}", cwd=tmp_path)
    assert out.returncode == 2
    assert "max_batch_size=1 is ignored" in out.stderr
    assert "error: sweep point 2 (trainer.global_batch_size=20)" in out.stderr
    assert not root.exists()


def test_local_sweep_dry_run_trains_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    out = launch("-m", "optim.lr=1e-3,2e-3", "trainer.max_steps=5", f"run.root={hq(root)}",
                 "launcher.dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("plan: local") == 2 and "dry run: nothing run" in out.stderr
    assert not root.exists()


def test_sweep_name_must_be_a_plain_name(tmp_path: Path) -> None:
    out = launch("-m", "optim.lr=1e-3,2e-3", "launcher.sweep_name=../x", f"run.root={hq(tmp_path / 'r')}",
                 "launcher.dry_run=true", cwd=tmp_path)
    assert out.returncode == 2 and "launcher.sweep_name='../x' must be a plain directory name" in out.stderr


def test_works_from_a_project_directory_with_its_own_train_py(tmp_path: Path) -> None:
    project = tmp_path / "my project"
    project.mkdir()
    (project / "train.py").write_text('raise SystemExit("the user\'s train.py was imported")\n')
    (project / "model.py").write_text("raise SystemExit('model.py imported')\n")
    out = launch("-m", "optim.lr=1e-3,2e-3", "+cluster=a100x16", "launcher.dry_run=true",
                 f"run.root={hq(project / 'runs')}", cwd=project)
    assert out.returncode == 0, out.stderr
    single = launch("+cluster=a100x16", "launcher.dry_run=true", f"run.root={hq(project / 'runs')}", cwd=project)
    assert single.returncode == 0, single.stderr
