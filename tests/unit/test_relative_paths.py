"""Relative paths are made absolute at launch (launcher/plan/paths.py): every key the schema declares as a path,
against the launch directory, `~` expanded; config.yaml holds them absolute, command.txt replays the command where it
was typed, the same command from the same directory names the same run and the same relative path typed elsewhere
names another. Runs named before (relative paths hashed as typed) go on resuming with the same command."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from contract.config import schema
from launcher.checks import key_checks
from launcher.checks.resume_checks import check_run_dir
from launcher.compose import compose_and_plan, compose_config
from launcher.plan import launch_plan
from launcher.plan.paths import make_absolute
from launcher.run import rundir
from tests.conftest import hq
from train.stability.advice import launch_command

DATA = ["data=tokens", "data.path=data/tok.bin", "run.root=runs", "logger.backend=none"]


def write_tokens(directory: Path) -> Path:
    (directory / "data").mkdir(parents=True, exist_ok=True)
    path = directory / "data" / "tok.bin"
    (np.arange(4000) % 256).astype(np.uint16).tofile(path)
    return path


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A launch directory with a token file in data/ (a shell-hostile name), the current directory."""
    launch_dir = tmp_path / "launch dir's"
    write_tokens(launch_dir)
    monkeypatch.chdir(launch_dir)
    return launch_dir


def test_the_schema_declares_every_path_key() -> None:
    declared = dict(key_checks.path_keys())
    assert declared == {"model.config_path": "", "model.init_from": "", "data.path": "", "data.sources": "path",
                        "run.root": "", "eval.sets": "path", "eval.harness.include_path": ""}

    def named_like_a_path(cls: type, prefix: str = "") -> set[str]:
        out: set[str] = set()
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = key_checks._section_type(hints[f.name])
            if sub is not None:
                out |= named_like_a_path(sub, f"{prefix}{f.name}.")
            elif str in (hints[f.name], *typing.get_args(hints[f.name])) and f.name.endswith(
                    ("path", "root", "dir", "file", "from")):
                out.add(f"{prefix}{f.name}")
        return out

    # A key added later whose name says it is a path is declared one (schema.path_key), or this fails. remote.workdir
    # is a path on the login node (relative to the remote user's home), never resolved against this directory;
    # container.workdir is a path inside the image.
    assert named_like_a_path(schema.Config) - {"remote.workdir", "container.workdir"} <= set(declared)


def test_every_path_key_is_made_absolute_against_the_launch_directory(
        here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(here / "home"))
    cfg = compose_config(["data=tokens", "data.path=./data//*.bin", "+data.sources.a.path=a.bin",
                          "data.sources.a.weight=1", "eval.sets.v.kind=tokens", "eval.sets.v.path=../v.bin",
                          "model.init_from='~/weights'", "model.config_path=/abs//hf", "run.root=runs"])
    typed = make_absolute(cfg)
    assert cfg.data.path == f"{here}/data/*.bin"  # a glob stays a glob; `.` parts and doubled slashes go
    assert cfg.data.sources.a.path == f"{here}/a.bin"
    assert cfg.eval.sets.v.path == f"{here.parent}/v.bin"  # `..` resolved in the text (os.path.normpath)
    assert cfg.model.init_from == f"{here}/home/weights"
    assert cfg.model.config_path == "/abs/hf"  # absolute ones normalised too (run_name finds runs named before)
    assert cfg.run.root == f"{here}/runs"
    assert typed == {"data.path": "./data//*.bin", "data.sources.a.path": "a.bin", "eval.sets.v.path": "../v.bin",
                     "model.init_from": "~/weights", "model.config_path": "/abs//hf", "run.root": "runs"}
    assert make_absolute(cfg) == {}  # once is enough


def test_a_run_launched_with_relative_paths_explains_itself_from_anywhere(here: Path) -> None:
    cfg, plan = compose_and_plan([*DATA, "eval.every=2", "eval.sets.v.kind=tokens", "eval.sets.v.path=data/tok.bin"])
    assert plan.run_dir == here / "runs" / cfg.run.name
    rundir.prepare(cfg, plan.run_dir, argv=["launcher", *DATA])
    saved = yaml.safe_load((plan.run_dir / "config.yaml").read_text())
    assert saved["data"]["path"] == f"{here}/data/tok.bin"
    assert saved["eval"]["sets"]["v"]["path"] == f"{here}/data/tok.bin"
    assert saved["run"]["root"] == f"{here}/runs"
    command = (plan.run_dir / "command.txt").read_text().strip()
    assert command.startswith(f"cd {shlex.quote(str(here))} && ")
    assert shlex.split(command)[-len(DATA):] == DATA
    assert json.loads((plan.run_dir / "environment.json").read_text())["launch_dir"] == str(here)


def test_the_same_command_names_the_same_run_only_from_the_same_directory(
        here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = compose_and_plan(DATA)[0].run.name
    assert compose_and_plan(DATA)[0].run.name == name
    # Typed as an absolute path, the same data is the same run.
    assert compose_and_plan([*DATA, f"data.path={hq(here / 'data' / 'tok.bin')}"])[0].run.name == name
    elsewhere = here.parent / "elsewhere"
    write_tokens(elsewhere)
    monkeypatch.chdir(elsewhere)
    cfg, plan = compose_and_plan(DATA)  # the same relative path: other data, another run
    assert cfg.run.name != name and cfg.data.path == f"{elsewhere}/data/tok.bin"
    assert plan.run_dir.parent == elsewhere / "runs"


def test_stop_advice_replays_the_launch_where_it_was_typed(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop advice's command (train/stability/advice.py) is the run's command.txt line, less the keys it sets."""
    cfg, plan = compose_and_plan([*DATA, "optim.lr=0.1"])
    rundir.prepare(cfg, plan.run_dir, argv=["launcher", *DATA, "optim.lr=0.1"])
    monkeypatch.chdir(here.parent)
    args = shlex.split(launch_command(plan.run_dir))
    assert args[:3] == ["cd", str(here), "&&"]
    assert args[3:] == [sys.executable, "-m", "launcher", *DATA]  # optim.lr is the advice's to set


def _launch_as_before(monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> Path:
    """What slurmtrain did before paths were made absolute: relative paths hashed and saved as typed."""
    with monkeypatch.context() as before:
        before.setattr(launch_plan, "make_absolute", lambda cfg: {})
        cfg, plan = compose_and_plan(overrides)
    assert OmegaConf.select(cfg, "data.path") == "data/tok.bin"
    rundir.prepare(cfg, Path("runs") / cfg.run.name, argv=["launcher", *overrides])
    return Path("runs").resolve() / cfg.run.name


def test_a_run_named_before_goes_on_with_the_same_command(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _launch_as_before(monkeypatch, DATA)
    assert "path: data/tok.bin" in (old / "config.yaml").read_text()
    cfg, plan = compose_and_plan(DATA)
    assert plan.run_dir == old
    check_run_dir(cfg, plan.run_dir, plan.world_size)  # its saved relative paths read from here: the same settings
    rundir.prepare(cfg, plan.run_dir)  # now saved absolute ...
    assert compose_and_plan(DATA)[1].run_dir == old  # ... and still the same run
    # Other settings are another run, as ever.
    assert compose_and_plan([*DATA, "optim.lr=1e-4"])[1].run_dir != old


def test_a_run_named_before_is_not_taken_for_other_data(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _launch_as_before(monkeypatch, DATA)
    cfg, plan = compose_and_plan(DATA)
    rundir.prepare(cfg, plan.run_dir)  # saved absolute: this directory's data
    elsewhere = here.parent / "elsewhere"
    write_tokens(elsewhere)
    monkeypatch.chdir(elsewhere)
    assert compose_and_plan([*DATA, f"run.root={hq(here / 'runs')}"])[1].run_dir != old


def test_a_saved_relative_config_resumes_under_its_run_name(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _launch_as_before(monkeypatch, [*DATA, "run.name=mine"])
    cfg, plan = compose_and_plan([*DATA, "run.name=mine"])
    assert plan.run_dir == old
    check_run_dir(cfg, plan.run_dir, plan.world_size)  # no "other training settings (data.path: ...)"


def test_a_run_saved_with_relative_paths_says_where_to_read_them_from(here: Path) -> None:
    """config.yaml files written before paths were made absolute: read elsewhere, the message says where to run."""
    from contract.data.run_tokenizer import run_tokenizer
    from contract.data.spec import token_sources
    from contract.errors import ConfigError

    data = OmegaConf.create({"name": "tokens", "path": "data/prepared", "dtype": "uint16", "sources": {}})
    tokenizer, why = run_tokenizer(data)
    assert tokenizer is None and "(a relative path: run this from the directory the run was launched in)" in why
    with pytest.raises(ConfigError, match="^" + re.escape(f"data.path=data/prepared is not a file in {here} (a relative "
                                                          "path): run this from the directory the run was launched in")):
        token_sources(data, on_ranks=True)


def test_a_dot_dot_in_a_path_names_the_same_data_and_the_same_run(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27's trial: from a/, data.path=corpus and data.path=../a/corpus gave two run directories, and
    config.yaml kept root: .../a/../b/runs. Normalised in the text (os.path.normpath), symlinks not followed."""
    name = compose_and_plan(DATA)[0].run.name
    via = f"../{here.name}/data/./tok.bin"
    cfg, plan = compose_and_plan(["data=tokens", f"data.path={hq(via)}", f"run.root={hq(f'../{here.name}//runs')}",
                                  "logger.backend=none"])
    assert cfg.run.name == name and cfg.data.path == str(here / "data" / "tok.bin")
    assert cfg.run.root == str(here / "runs") and plan.run_dir == here / "runs" / name
    link = here.parent / "link"
    link.symlink_to(here / "data")
    assert compose_and_plan([*DATA[:1], f"data.path={hq(f'{link}/tok.bin')}", *DATA[2:]])[0].data.path == \
        f"{link}/tok.bin"  # a symlink stays as typed


def test_a_run_named_with_a_dot_dot_before_goes_on_with_the_same_command(
        here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = ["data=tokens", f"data.path={hq(f'../{here.name}/data/tok.bin')}", "run.root=runs",
                 "logger.backend=none"]
    with monkeypatch.context() as before:  # absolute, '..' kept: what slurmtrain did before normalising
        from launcher.plan import paths
        before.setattr(paths, "absolute", paths._joined)
        cfg, plan = compose_and_plan(overrides)
    assert "/../" in cfg.data.path
    rundir.prepare(cfg, plan.run_dir, argv=["launcher", *overrides])
    old = plan.run_dir
    cfg, plan = compose_and_plan(overrides)
    assert plan.run_dir == old and "/../" not in cfg.data.path
    check_run_dir(cfg, plan.run_dir, plan.world_size)  # its saved '..' paths read the same: the same settings
