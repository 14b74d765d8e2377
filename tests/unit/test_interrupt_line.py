"""The launcher's line when a stop reaches it (launcher/run/local.py WorkerGroup.on_interrupt): a Ctrl-C names the
second Ctrl-C that stops the workers at once; a SIGTERM (scancel of a SLURM search worker, a batch shell passing one
on) has no terminal to press it on, and the re-trial of issue 48 found the line offering it anyway."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from launcher.run.local import WorkerGroup


@pytest.mark.parametrize(("signum", "offered"), [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_only_a_ctrl_c_is_offered_a_second_one(signum: int, offered: bool, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    group = WorkerGroup(tmp_path / "config.yaml", 2)
    group.on_interrupt(signum, None)
    err = capsys.readouterr().err
    assert f"launcher: got {signal.Signals(signum).name}, asking workers to checkpoint and stop" in err
    assert ("Ctrl-C again" in err) is offered, err
    assert group.stop_asked is not None
