"""python -m launcher.run.lighthouse_keeper RUN_DIR: the lighthouse of replica groups on SLURM, kept for as long as their
job array lives (launcher/run/replica_slurm.py starts it: on the login node, detached, with parallel.lighthouse=login;
otherwise as the one task of a job of its own).

It starts torchft's lighthouse (launcher/run/lighthouse.py) bound to the address this host's name resolves to (the
cluster network, not every interface: its dashboard has an unauthenticated kill endpoint), writes that name and port
to RUN_DIR/lighthouse.json, starts it again at the same address if it dies, and stops it once the array has left the
queue, or when no array is recorded in RUN_DIR/replicas/array_job within ARRAY_WAIT_S (its submission failed).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from omegaconf import OmegaConf

from launcher.run import lighthouse

ARRAY_WAIT_S = 300.0
POLL_S = 5.0
ARRAY_FILE = "array_job"


def array_file(run_dir: Path) -> Path:
    return Path(run_dir) / "replicas" / ARRAY_FILE


def array_queued(array: str) -> bool | None:
    """Whether SLURM still has a task of the array queued or running; None when squeue could not say."""
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", array], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        # squeue refuses a job id it no longer knows ("Invalid job id"): the array has gone
        return False if "invalid job id" in out.stderr.lower() else None
    return bool(out.stdout.strip())


def keep(run_dir: Path) -> int:
    parallel = OmegaConf.load(run_dir / "config.yaml").parallel
    name = socket.gethostname()
    try:
        bind = socket.gethostbyname(name)
    except OSError:
        bind = "127.0.0.1"
    started_by = "job" if os.environ.get("SLURM_JOB_ID") else "login"
    beacon = lighthouse.start(OmegaConf.merge(parallel, {"lighthouse": None}), run_dir, host=bind, advertise=name,
                              started_by=started_by, ready_timeout_s=lighthouse.SLURM_READY_TIMEOUT_S)
    print(f"lighthouse at {name}:{beacon.address.rpartition(':')[2]} (bound to {beacon.address})", flush=True)
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    deadline, gone = time.monotonic() + ARRAY_WAIT_S, 0
    try:
        while not stopping:
            array = array_file(run_dir).read_text().strip() if array_file(run_dir).is_file() else ""
            if not array and time.monotonic() > deadline:
                print("no job array was recorded: stopping the lighthouse", flush=True)
                return 1
            if array:
                queued = array_queued(array)
                gone = gone + 1 if queued is False else 0
                if gone >= 2:  # twice in a row: squeue can miss a task between two of its states
                    print(f"job array {array} has left the queue: stopping the lighthouse", flush=True)
                    return 0
            if not beacon.alive():
                print(f"the lighthouse at {beacon.address} died; starting it again there", flush=True)
                beacon = lighthouse.start(OmegaConf.merge(parallel, {"lighthouse": None}), run_dir, host=bind,
                                          address=beacon.address, advertise=name, started_by=started_by,
                                          ready_timeout_s=lighthouse.SLURM_READY_TIMEOUT_S)
            time.sleep(POLL_S)
        return 0
    finally:
        beacon.stop()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "config.yaml").is_file():
        print("usage: python -m launcher.run.lighthouse_keeper RUN_DIR (a run directory with its config.yaml)",
              file=sys.stderr)
        return 2
    return keep(Path(args[0]).resolve())


if __name__ == "__main__":
    sys.exit(main())

