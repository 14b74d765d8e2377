"""scripts/pidfile.sh, which the up/down scripts of the local cluster, login node and container runtimes read their
daemons' pid files with: a pid file left from before counts only while the process it names is the one that wrote
it (CI once found a stale slurmd-n2.pid naming the live slurmd of n1, took n2 for running, and never started it)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

PIDFILE_SH = Path(__file__).resolve().parents[2] / "scripts" / "pidfile.sh"


def pid_of(pidfile: Path, comm: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", 'source "$0"; pid_of "$1" "$2"', str(PIDFILE_SH), str(pidfile), comm],
                          capture_output=True, text=True)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_file_written_by_its_live_process_names_it(tmp_path: Path, sleeper) -> None:
    f = tmp_path / "daemon.pid"
    f.write_text(f"{sleeper.pid}\n")
    out = pid_of(f, "sleep")
    assert out.returncode == 0 and out.stdout.strip() == str(sleeper.pid)


def test_a_pid_file_older_than_its_process_is_stale(tmp_path: Path, sleeper) -> None:
    f = tmp_path / "daemon.pid"
    f.write_text(f"{sleeper.pid}\n")
    hour_ago = time.time() - 3600
    os.utime(f, (hour_ago, hour_ago))  # written an hour before this pid was handed to the process now holding it
    out = pid_of(f, "sleep")
    assert out.returncode != 0 and out.stdout == ""


def test_another_name_a_dead_pid_or_no_file_is_not_running(tmp_path: Path, sleeper) -> None:
    f = tmp_path / "daemon.pid"
    f.write_text(f"{sleeper.pid}\n")
    assert pid_of(f, "slurmd").returncode != 0
    done = subprocess.Popen(["true"])
    done.wait()
    f.write_text(f"{done.pid}\n")
    assert pid_of(f, "true").returncode != 0
    assert pid_of(tmp_path / "absent.pid", "sleep").returncode != 0
