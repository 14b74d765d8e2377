"""A search's workers as processes on this machine (no +cluster): started in sessions of their own that die with
this command, waited for, a Ctrl-C (or a stop signal) forwarded so that they checkpoint their trials and stop; then
the status table and the command's exit code (1 when no trial completed: no best)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.errors import EXIT_STOPPED, ConfigError
from contract.search import layout


def refuse_live_local_workers(sweep_dir: Path) -> None:
    """Workers of an earlier command on this host still at work (another terminal): a second set would resume the
    trials they train."""
    import socket

    for path in sorted((sweep_dir / layout.WORKERS_DIR).glob("worker_*.json")):
        state = layout.read_json(path, {})
        pid = state.get("pid")
        if state.get("job") or state.get("host") != socket.gethostname() or not isinstance(pid, int):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        raise ConfigError(f"search {sweep_dir.name} is still running here (worker pid {pid}): wait for it, or stop it "
                          f"(kill -TERM {pid} checkpoints its trial) and run this command again")


def die_with_parent() -> Callable[[], None] | None:
    """For a local worker's Popen(preexec_fn=...): SIGTERM when the command that started it dies however it dies (a
    kill -9, a terminal's SIGKILL), which checkpoints the worker's trial and stops it. In sessions of their own (a
    Ctrl-C reaches them through the command, once), the workers went on training the whole study unseen. Linux
    only (None elsewhere). prctl is looked up here, before the fork: the child only calls it (no import there)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl, term = ctypes.CDLL(None, use_errno=True).prctl, int(signal.SIGTERM)
    return lambda: prctl(1, term)  # PR_SET_PDEATHSIG


def run_local_workers(sweep_dir: Path, spec: layout.SearchSpec) -> int:
    """search.parallel worker processes on this machine; Ctrl-C (or a stop signal) asks them to checkpoint their trials
    and stop, and the same command resumes."""
    import signal

    from launcher.sweeps.search_status import print_status

    cmd = [sys.executable, "-m", "launcher.sweeps.search_worker", str(sweep_dir)]
    procs = [subprocess.Popen([*cmd, str(i)], start_new_session=True, preexec_fn=die_with_parent())
             for i in range(spec.parallel)]
    print(f"search {sweep_dir.name}: {spec.parallel} local worker(s) started", file=sys.stderr, flush=True)

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    try:
        codes = [p.wait() for p in procs]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print_status(sweep_dir)
    print(f"sweep directory: {sweep_dir}", file=sys.stderr)
    if any(c == EXIT_STOPPED for c in codes):
        print("search stopped: a trial was checkpointed; run the same command to resume it and continue",
              file=sys.stderr)
        return EXIT_STOPPED
    return next((c for c in codes if c), 0) or ended_without_best(sweep_dir)


def ended_without_best(sweep_dir: Path) -> int:
    """1 when the search ended with no trial complete (every one pruned or failed: no best to export or compare), with
    a line saying so; 0 otherwise. A script chaining `search && export` stopped at a best that was not there."""
    from launcher.sweeps.search_status import collect, no_best

    summary = collect(sweep_dir)
    if summary.best is not None:
        return 0
    print(f"search {sweep_dir.name}: {no_best(summary)}", file=sys.stderr)
    return 1
