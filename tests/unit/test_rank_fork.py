"""Local ranks forked from one zygote (launcher/run/rank_fork.py) are the launcher's own children, as subprocess's
are: exit codes and signals reach it, and each rank has exactly its own environment, output, descriptors, session,
held stop signals and parent-death signal. Each case runs a small launcher in a process of its own: the launcher
makes itself a subreaper, which the test process must not become."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from launcher.run import rank_fork

# The zygote: no preload, and each rank reports what it became, then exits with 10 + its rank (rank 2 waits to be
# killed).
ZYGOTE = textwrap.dedent("""
    import ctypes, json, os, signal, sys
    from launcher.run import rank_fork
    argv = rank_fork.serve(int(sys.argv[1]), lambda: None)
    rank = int(os.environ["RANK"])
    pdeath = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(pdeath), 0, 0, 0)  # PR_GET_PDEATHSIG
    held = set(signal.pthread_sigmask(signal.SIG_BLOCK, set()))
    def is_open(fd):
        try:
            return os.fstat(fd) is not None
        except OSError:
            return False
    fds = [fd for fd in map(int, os.listdir("/proc/self/fd")) if is_open(fd)]  # not the listing's own
    print(json.dumps({"rank": rank, "argv": argv, "sys_argv": sys.argv[1:], "env": dict(os.environ),
                      "fds": sorted(fds), "ppid": os.getppid(),
                      "own_session": os.getsid(0) == os.getpid(), "pdeathsig": pdeath.value,
                      "held": sorted(int(s) for s in held)}), flush=True)
    if rank == 2:
        signal.pause()
    sys.exit(10 + rank)
""")

LAUNCHER = textwrap.dedent("""
    import json, os, signal, socket, sys
    from launcher.run import rank_fork
    log_dir, zygote = sys.argv[1], sys.argv[2]
    assert rank_fork.enabled(0)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    specs = []
    for rank in range(3):
        out = None if rank == 0 else os.open(f"{log_dir}/rank_{rank}.log", os.O_WRONLY | os.O_CREAT, 0o644)
        specs.append(rank_fork.RankSpec(["--config", f"c{rank}.yaml"], {"RANK": str(rank), "ONLY": "theirs"}, out,
                                        (held.fileno(),) if rank == 0 else ()))
    ranks = rank_fork.start_ranks(specs, {**os.environ, "ZYGOTE_ONLY": "1"}, ("-c", zygote))
    for spec in specs[1:]:
        os.close(spec.output_fd)
    codes = [ranks[0].wait(timeout=60), ranks[1].wait(timeout=60)]
    try:
        ranks[2].wait(timeout=0.2)
        codes.append("ended")
    except Exception as e:
        codes.append(type(e).__name__)
    ranks[2].send_signal(signal.SIGKILL)
    codes.append(ranks[2].wait(timeout=60))
    print("RESULT " + json.dumps({"launcher": os.getpid(), "held_fd": held.fileno(), "codes": codes,
                                  "pids": [r.pid for r in ranks]}), flush=True)
""")


def _run(tmp_path: Path, zygote: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp_path), zygote], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT "):])
    reports = [json.loads(line) for line in lines if not line.startswith("RESULT ")]
    reports += [json.loads((tmp_path / f"rank_{r}.log").read_text()) for r in (1, 2)]
    return result, reports


def test_forked_ranks_are_the_launchers_children_each_with_only_its_own_environment_and_output(
        tmp_path: Path) -> None:
    result, reports = _run(tmp_path, ZYGOTE)
    # Exit codes, a wait that times out, and a signal's death: the launcher reaps each rank itself.
    assert result["codes"] == [10, 11, "TimeoutExpired", -9]
    by_rank = {r["rank"]: r for r in reports}
    assert sorted(by_rank) == [0, 1, 2]  # rank 0 wrote to the launcher's stdout, ranks 1 and 2 to their logs
    for rank, report in by_rank.items():
        assert report["ppid"] == result["launcher"]
        assert report["env"] == {"RANK": str(rank), "ONLY": "theirs"}  # nothing of the zygote's environment
        assert report["argv"] == report["sys_argv"] == ["--config", f"c{rank}.yaml"]
        assert report["own_session"] and report["pdeathsig"] == 15  # SIGTERM should the launcher die
        assert {10, 15} <= set(report["held"])  # SIGUSR1, SIGTERM held until train/entry.py takes them
    # Descriptors: the standard three, plus the store's socket for rank 0 only.
    assert result["held_fd"] in by_rank[0]["fds"]
    assert all(result["held_fd"] not in by_rank[r]["fds"] for r in (1, 2))
    assert [by_rank[r]["fds"] for r in (1, 2)] == [[0, 1, 2], [0, 1, 2]]
    assert by_rank[0]["fds"] == sorted([0, 1, 2, result["held_fd"]])
    assert sorted(result["pids"]) == sorted(set(result["pids"]))


def test_a_zygote_that_dies_before_starting_every_rank_leaves_none_running(tmp_path: Path) -> None:
    """start_ranks() gives None (the launcher then starts each rank as a process of its own) and kills the rank it
    had, so that no rank runs unsupervised."""
    zygote = textwrap.dedent("""
        import os, signal, sys
        from launcher.run import rank_fork
        zygote, fork = os.getpid(), os.fork
        def dying_fork(forks=[0]):
            forks[0] += os.getpid() == zygote
            if forks[0] == 2 and os.getpid() == zygote:
                os.kill(zygote, signal.SIGKILL)  # the zygote dies as it forks the second rank
            return fork()
        os.fork = dying_fork
        rank_fork.serve(int(sys.argv[1]), lambda: None)
        signal.pause()  # the first rank would run until killed
    """)
    script = textwrap.dedent("""
        import json, os, sys
        from launcher.run import rank_fork
        assert rank_fork.enabled(0)
        specs = [rank_fork.RankSpec([], {"RANK": str(r)}) for r in range(2)]
        print(json.dumps(rank_fork.start_ranks(specs, dict(os.environ), ("-c", sys.argv[1])) is None))
        ppid = lambda pid: open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()[1]
        print(json.dumps([p for p in os.listdir("/proc") if p.isdigit() and ppid(p) == str(os.getpid())]))
    """)
    out = subprocess.run([sys.executable, "-c", script, zygote], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    gave_none, children = [json.loads(line) for line in out.stdout.splitlines()[:2]]
    assert gave_none is True
    assert children == []  # the first rank was killed and reaped: nothing of the attempt is left


def test_ranks_on_gpus_or_asked_not_to_start_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA driver call before a fork leaves CUDA unusable in the child: GPU ranks are never forked."""
    monkeypatch.setattr(rank_fork, "_prctl", lambda option, value: True)  # the test process stays no subreaper
    assert rank_fork.enabled(0)
    assert not rank_fork.enabled(2)
    monkeypatch.setenv(rank_fork.FORK_ENV, "0")
    assert not rank_fork.enabled(0)
