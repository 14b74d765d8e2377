"""How a command ends when its terminal does (launcher/commands.py run): `... | head` closing the pipe is a quiet
exit 141, Ctrl-C one line and exit 130; neither a traceback (`launcher.status ... | head` printed a BrokenPipeError
traceback, Ctrl-C in `launcher.sample` a 62-line KeyboardInterrupt one)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.commands import run
from tests.conftest import ROOT, launcher_env


@pytest.mark.parametrize("as_json", [False, True])
def test_a_closed_pipe_ends_status_quietly(tmp_path: Path, as_json: bool) -> None:
    from tests.prepared_data import write_prepared

    for name in ("a", "b"):
        write_prepared(tmp_path / "corpus" / name, [[1, 2, 0]] * 4, vocab=8, eod_id=0)
    # The reading end is closed before the interpreter has started: the table's first write meets a closed pipe.
    proc = subprocess.Popen([sys.executable, "-m", "launcher.status", str(tmp_path / "corpus"),
                             *(["--json"] if as_json else [])], cwd=ROOT, env=launcher_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    # rich's console ends a table's broken pipe itself (exit 1, quietly); the JSON is ours (exit 141)
    assert proc.wait(timeout=120) == (141 if as_json else 1), err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_ctrl_c_is_one_line_and_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as end:
        run(interrupted)
    assert end.value.code == 130 and capsys.readouterr().err == "interrupted (Ctrl-C)\n"
    with pytest.raises(SystemExit) as end:
        run(lambda: 2)
    assert end.value.code == 2



def test_ctrl_c_while_the_launcher_plans_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """Ctrl-C between the plan and the workers' start printed a KeyboardInterrupt traceback from dispatch: here the
    interrupt comes where dispatch would run, in the real entry point."""
    script = ("import runpy, sys\n"
              "import launcher.run.dispatch as d\n"
              "def interrupted(*args, **kwargs):\n    raise KeyboardInterrupt\n"
              "d.dispatch = interrupted\n"
              "sys.argv = ['launcher', 'trainer.max_steps=1', 'logger.backend=none']\n"
              "runpy.run_module('launcher', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env={**launcher_env(), "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("launcher: interrupted (Ctrl-C); run the same command again")


def test_ctrl_c_while_the_launcher_imports_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """A Ctrl-C in the launcher's first half second, while it imports Hydra, printed a 40-line KeyboardInterrupt
    traceback: here the SIGINT comes from inside that import (a `hydra` ahead of the real one on the path)."""
    fake = tmp_path / "fake" / "hydra"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    env = {**launcher_env(), "PYTHONPATH": f"{fake.parent}:{ROOT}"}
    # As a terminal starts it: Ctrl-C raises. A shell's background job (`make test &`) inherits SIGINT ignored, where
    # the launcher rightly leaves it ignored and this test would prove nothing.
    out = subprocess.run([sys.executable, "-m", "launcher", "trainer.max_steps=1"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "launcher: interrupted (Ctrl-C); run the same command again (a run resumes from its newest checkpoint)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake"]  # nothing created
