"""Standard output and error outlive their terminal (contract/terminal.py): a pipe whose reader closed and a terminal
that hung up, written to by print, logging, a direct write to the buffer and the interpreter's flush at exit, in a
real child process; tests/dist/test_local_attempts.py does it to a real local run."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Writes once the terminal is gone, then says (in a file: not on the terminal) what it saw.
CHILD = r"""
import logging, sys
from contract.terminal import outlive_terminal

gone = []
outlive_terminal(on_gone=gone.append)
print("ready", flush=True)
sys.stdin.readline()  # the parent closes the terminal, then says go on
print("x" * 100000)  # larger than a pipe's buffer: a partial write first
sys.stderr.write("to stderr\n")
logging.basicConfig(stream=sys.stderr)
logging.getLogger("t").warning("a log line")
sys.stdout.buffer.write(b"bytes\n")
sys.stdout.write("left in the buffer at exit")
with open(sys.argv[1], "w") as f:
    f.write(",".join(gone) + "|" + str(sys.stdout.isatty()))
"""


def _run(tmp_path: Path, terminal: str) -> tuple[subprocess.CompletedProcess[bytes], str]:
    report = tmp_path / "report.txt"
    if terminal == "pipe":
        read_end, write_end = os.pipe()
    else:
        read_end, write_end = pty.openpty()  # master, slave
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(report)], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=write_end, stderr=write_end)
    os.close(write_end)
    seen = b""
    while b"ready" not in seen:
        seen += os.read(read_end, 100)
    os.close(read_end)  # the reader goes away: `| head` ends, or the SSH session drops
    assert child.stdin is not None
    child.stdin.write(b"go\n")
    child.stdin.close()
    child.wait(timeout=60)
    return subprocess.CompletedProcess(child.args, child.returncode), report.read_text()


@pytest.mark.parametrize("terminal", ["pipe", "pty"])
def test_writes_after_the_terminal_went_away_neither_fail_nor_end_the_process(tmp_path: Path, terminal: str) -> None:
    done, report = _run(tmp_path, terminal)
    assert done.returncode == 0  # 120 is the interpreter failing to flush stdout at exit; 1 an uncaught error
    gone, tty = report.split("|")
    assert sorted(gone.split(",")) == ["stderr", "stdout"]  # each stream said so once
    assert tty == "False"


def test_a_regular_file_is_left_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    code = ("import sys; from contract.terminal import outlive_terminal; before = sys.stdout; outlive_terminal(); "
            "print(sys.stdout is before)")
    with out.open("w") as f:
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=f, check=True, timeout=60)
    assert out.read_text() == "True\n"
