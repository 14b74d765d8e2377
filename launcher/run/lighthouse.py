"""The torchft lighthouse that replica groups agree on a quorum through (parallel.replica_groups, docs/faults.md).

The launcher starts torchft's own `torchft_lighthouse` binary (shipped in the torchft wheel; the launcher never
imports torch or torchft) and writes its address to RUN_DIR/lighthouse.json. Locally it listens on 127.0.0.1 only:
its dashboard has an unauthenticated kill endpoint. On SLURM it binds the address its host's name resolves to, the
cluster network (launcher/run/lighthouse_keeper.py). parallel.lighthouse names one already running instead; it must
answer before anything starts (checked by `reachable`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from contract.errors import ConfigError
from contract.rundir.replicas import write_lighthouse
from launcher.plan.replica_plan import check_lighthouse, reachable
from launcher.plan.replica_slurm_plan import LOGIN

READY_TIMEOUT_S = 20.0
# The binary is torchft's console script: it imports torchft, and so torch, before it listens (20 s and more on a
# loaded node).
SLURM_READY_TIMEOUT_S = 180.0


def binary() -> str:
    """torchft_lighthouse beside this interpreter (the wheel's console script), else on PATH."""
    beside = Path(sys.executable).with_name("torchft_lighthouse")
    found = str(beside) if beside.exists() else shutil.which("torchft_lighthouse")
    if not found:
        raise ConfigError("parallel.replica_groups needs torchft's lighthouse (torchft_lighthouse): "
                          "pip install -e .[ft]")
    return found


def url(address: str) -> str:
    """What torchft's clients take: http://host:port."""
    return address if "://" in address else f"http://{address}"


def _free_port(host: str) -> int:
    # The binary does not say which port it bound to when given port 0: one is picked here, and a clash (a port
    # taken between this and its bind) shows as a lighthouse that never answers, said in one line.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Lighthouse:
    def __init__(self, proc: subprocess.Popen[bytes] | None, address: str) -> None:
        self.proc, self.address = proc, address

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None


def start(parallel: Any, run_dir: Path, host: str = "127.0.0.1", address: str | None = None,
          advertise: str | None = None, started_by: str = "launcher", ready_timeout_s: float = READY_TIMEOUT_S
          ) -> Lighthouse:
    """The run's lighthouse: the one parallel.lighthouse names, or one started here (its log in
    RUN_DIR/logs/lighthouse.log). min_replicas 1: the groups left after a loss go on. `address`: start it again
    where it was (one that died: the groups' Managers ask it anew at their next quorum). `host`: the interface it
    binds; `advertise`: the name the groups reach it by, in lighthouse.json (default: `host`)."""
    if parallel.lighthouse and parallel.lighthouse != LOGIN:
        check_lighthouse(str(parallel.lighthouse))
        write_lighthouse(run_dir, str(parallel.lighthouse), str(parallel.lighthouse).rpartition(":")[0], None,
                         "user")
        return Lighthouse(None, str(parallel.lighthouse))
    address = address or f"{host}:{_free_port(host)}"
    (Path(run_dir) / "logs").mkdir(parents=True, exist_ok=True)
    log = open(Path(run_dir) / "logs" / "lighthouse.log", "ab")  # noqa: SIM115 - the child holds it
    argv = [binary(), "--min_replicas", "1", "--bind", address,
            "--join_timeout_ms", str(int(parallel.replica_join_timeout_ms)),
            "--heartbeat_timeout_ms", str(int(parallel.replica_heartbeat_timeout_ms)), "--quorum_tick_ms", "50"]
    try:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")})
    finally:
        log.close()
    deadline = time.monotonic() + ready_timeout_s
    while not reachable(address, 0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            Lighthouse(proc, address).stop()
            raise RuntimeError(f"the lighthouse did not start on {address}: see {Path(run_dir) / 'logs'}/lighthouse.log")
        time.sleep(0.05)
    port = address.rpartition(":")[2]
    name = advertise or address.rpartition(":")[0]
    write_lighthouse(run_dir, f"{name}:{port}", socket.gethostname(), proc.pid, started_by)
    return Lighthouse(proc, address)
