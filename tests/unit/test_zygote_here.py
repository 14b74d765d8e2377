"""launcher/run/zygote_here.py: a launcher whose process imported the compute side already forks its ranks' zygote
from itself, and each rank starts as a fresh `python -m launcher.worker` would (tests' launch() runs every local run
this way, tests/forked_cli.py; a run started from the shell takes the fresh zygote)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A process that did what a launcher may have done before its ranks start: an exit handler, signal handlers, logging,
# an open file, something in stdout's buffer, an environment of its own. The zygote's serve() writes what a rank would
# find, then the rank runs `launcher.worker --help`.
SCRIPT = r"""
import atexit, json, logging, os, signal, sys
import torch, train.entry, train.loop
from launcher.run import zygote_here

report, marker = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(marker, "a").write(f"{os.getpid()}\n"))
signal.signal(signal.SIGTERM, lambda *a: None)
signal.signal(signal.SIGINT, signal.SIG_IGN)
logging.basicConfig(level=logging.DEBUG)
held = open(report + ".held", "w")
sys.stdout = open(1, "w", closefd=False)  # block-buffered: the launcher's pending output stays the launcher's
sys.stdout.write("launcher's pending line\n")
os.environ["LAUNCHER_ONLY"] = "1"
assert zygote_here.can_fork()
r, w = os.pipe()

def serve(fd):
    fds = sorted(int(x) for x in os.listdir("/proc/self/fd"))
    with open(report, "w") as f:
        json.dump({"env": dict(os.environ), "fds": fds,
                   "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "int": signal.getsignal(signal.SIGINT)
                   is signal.default_int_handler, "handlers": len(logging.getLogger().handlers),
                   "sid": os.getsid(0) == os.getpid(), "passed": fd}, f)
    return ["--help"]

from launcher import worker
zygote = zygote_here.fork_zygote(w, {w}, {"ZYGOTE_ENV": "yes", "PYTHONUNBUFFERED": "1"}, lambda: None, serve,
                                 worker.main)
print("zygote exit", zygote.wait(), flush=True)
"""


def test_the_forked_zygote_starts_each_rank_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    report, marker = tmp_path / "report.json", tmp_path / "exit_handlers"
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(report), str(marker)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(report.read_text())
    assert got["env"] == {"ZYGOTE_ENV": "yes", "PYTHONUNBUFFERED": "1"}
    # Only the standard streams, the passed descriptor and listdir's own: the launcher's file and pipe are closed.
    assert got["passed"] in got["fds"] and len(set(got["fds"]) - {0, 1, 2, got["passed"]}) == 1, got["fds"]
    assert got["term"] and got["int"] and got["handlers"] == 0 and got["sid"]
    # The rank ran the worker (its --help), exited 0; only the launcher ran its exit handler and wrote its line.
    assert "python -m launcher.worker --config RUN_DIR/config.yaml" in out.stdout
    assert "zygote exit 0" in out.stdout
    assert out.stdout.count("launcher's pending line") == 1
    assert len(marker.read_text().split()) == 1


def test_a_process_without_the_compute_side_or_with_a_thread_starts_a_fresh_zygote() -> None:
    script = ("import threading, time\nfrom launcher.run import zygote_here\nbare = zygote_here.can_fork()\n"
              "import torch, train.entry, train.loop\nready = zygote_here.can_fork()\n"
              "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
              "print(bare, ready, zygote_here.can_fork())")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True", "False"], out.stderr
