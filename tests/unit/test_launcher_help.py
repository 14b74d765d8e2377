"""`python -m launcher --help` says what slurmtrain is and lists the config groups of the config directories and
the commands, never Hydra's internal groups; `python -m launcher.worker --help` documents every way it starts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import worker
from launcher.checks.group_names import CONF_DIR
from launcher.commands import COMMANDS
from tests.conftest import launcher_env


def _help(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher", *args, "--help"], cwd=cwd, env=launcher_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_says_what_slurmtrain_is_and_lists_groups_and_commands(tmp_path: Path) -> None:
    own = tmp_path / "conf" / "model"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text("name: mine\n")
    text = _help("--config-dir", "conf", "model=llama3_8b", cwd=tmp_path)
    assert text.startswith("slurmtrain trains language models on one machine or a SLURM cluster")
    assert "powered by Hydra" not in text
    listed = text.split("== Config groups ==", 1)[1].split("== Commands ==", 1)[0]
    groups = dict(re.findall(r"^\+?(\w+): +(.+)$", listed, flags=re.M))
    assert set(groups) == {p.name for p in CONF_DIR.iterdir() if p.is_dir()}  # no slurmtrain: open_sources
    for group in groups:
        options = [o.rstrip("*") for o in groups[group].split(", ")]
        assert set(options) >= {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
    assert "mine" in groups["model"].split(", ")  # the user's --config-dir groups too
    assert "llama3_8b*" in groups["model"] and "adamw*" in groups["optim"]  # the options in use
    assert re.search(r"^\+cluster: ", text, flags=re.M)
    for module, what in COMMANDS:
        assert re.search(rf"^python -m {re.escape(module)} +{re.escape(what)}$", text, flags=re.M)


def test_worker_help_documents_every_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert worker.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--config RUN_DIR/config.yaml", "--probe", "--evaluate RUN_DIR STEP [CONFIG]", "--init-from"):
        assert f"python -m launcher.worker {flag}" in text
