"""`python -m MODULE ARGS` without paying Python's and Hydra's import time on every call.

A server process imports the launcher's dependencies once; each call is a fresh process forked from it, with its
own working directory, environment, argv, modules and Hydra state as a new interpreter would have them, in which the
module runs as `python -m` runs it (runpy, as `__main__`, the working directory first on sys.path). Its exit code
and output come back as subprocess.run would give them. A test that proves the command-line wiring itself still
starts a real interpreter (tests/unit/test_bad_inputs.py does both, and checks that they agree).

    python -m tests.forked_cli SOCKET MODULE,...   a server that imported MODULEs (started by run_module, one per
                                                   preload list, stopped when this process exits)
"""

from __future__ import annotations

import atexit
import io
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Client, Connection
from pathlib import Path

from launcher.run.zygote_here import exit_code

ROOT = Path(__file__).resolve().parent.parent
# What `python -m launcher` imports on its way to a refusal (one missing here only makes each call slower).
PRELOAD = ("launcher", "hydra", "hydra.main", "hydra._internal.utils", "hydra._internal.hydra",
           "hydra._internal.core_plugins.basic_launcher", "hydra._internal.core_plugins.basic_sweeper",
           "hydra._internal.instantiate._instantiate2", "hydra_plugins.slurmtrain_launcher", "omegaconf",
           "launcher.run.dispatch", "contract.config.schema", "launcher.checks.hydra_errors",
           "launcher.checks.overrides", "launcher.sweeps.sweep", "launcher.plan.launch_plan",
           "launcher.checks.resume_checks", "launcher.run.rundir", "launcher.plan.probe",
           "launcher.checks.input_checks", "launcher.checks.key_checks", "launcher.checks.cluster_checks")
# What a training run imports besides: a run's local ranks, which the launcher then forks from itself
# (launcher/run/zygote_here.py) rather than from a zygote that imports all this again.
RUN_PRELOAD = (*PRELOAD, "torch", "torch._dynamo", "torch.distributed.checkpoint._fsspec_filesystem", "train.entry",
               "train.faults.preemption", "train.faults.recovery", "train.faults.signals", "train.faults.watchdog",
               "train.loop", "train.model.transformer", "train.observe.metrics", "train.strategies.mesh",
               "launcher.worker", "launcher.run.local", "launcher.run.rank_fork")
# What `python -m launcher.export` imports (torch, the checkpoint reader, safetensors, transformers).
EXPORT_PRELOAD = ("launcher.export", "torch", "torch.distributed.checkpoint", "safetensors.torch", "train.weights.export",
                  "train.model.build", "train.model.hf", "transformers")

_lock = threading.Lock()
_servers: dict[tuple[str, ...], tuple[subprocess.Popen[str], str]] = {}


def _stream(fd: int) -> io.TextIOWrapper:
    # As PYTHONUNBUFFERED=1 (tests.conftest.launcher_env) makes them: every write reaches the file at once.
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                            write_through=True)


def _run_here(module: str, args: list[str], cwd: str, env: dict[str, str], umask: int) -> tuple[int, str, str]:
    """In a forked child of the server: run the module as `python -m` would, its output caught."""
    if umask >= 0:
        os.umask(umask)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[0] = cwd  # the server's was the repository root, as `python -m` puts the working directory first
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # At the file descriptors, so that what the command's own child processes print is caught too.
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = _stream(1), _stream(2)
        sys.argv = [module, *args]
        sys.modules.pop(module, None)  # preloaded as a module, it runs as __main__ here, as in a new interpreter
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            code = exit_code(exit_.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", errors="backslashreplace"))
    return code, texts[0], texts[1]


def _quit(signum: int, frame: object) -> None:
    """The test process that started this server is gone (its PR_SET_PDEATHSIG): its socket and folder go too."""
    Path(sys.argv[1]).unlink(missing_ok=True)
    try:
        Path(sys.argv[1]).parent.rmdir()
    except OSError:
        pass
    os._exit(0)


def serve(address: str, preload: Sequence[str]) -> None:
    """Import `preload`, then fork a child for each connection, until the test process that started this server is
    gone: its end of our stdin closes, as it does even for a test process that exits without its atexit handlers (an
    xdist worker can). (Not PR_SET_PDEATHSIG: that fires when the parent *thread* ends, and a test may start the
    server from a thread of a pool that ends long before the test process.)"""
    signal.signal(signal.SIGTERM, _quit)
    for name in preload:
        try:
            __import__(name)
        except ImportError:
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked children are reaped by the system
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(64)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([server, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            _quit(signal.SIGTERM, None)
        if server not in ready:
            continue
        client, _ = server.accept()
        conn = Connection(client.detach())  # what multiprocessing's Listener (no authkey) hands out
        if os.fork() == 0:
            code = 1
            try:
                server.close()
                devnull = os.open(os.devnull, os.O_RDONLY)  # not our stdin, the test process's pipe
                os.dup2(devnull, 0)
                os.close(devnull)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command waits for its own children
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                conn.send(os.getpid())  # run_module's to kill on a timeout
                conn.send(_run_here(*conn.recv()))
                code = 0
            finally:
                os._exit(code)
        conn.close()


def _stop(proc: subprocess.Popen[str], folder: str, owner: int) -> None:
    """At the exit of the test process that started the server; not in a child forked from it (a dist test's rank
    that exits through its atexit handlers), which would stop the server under its parent."""
    if os.getpid() != owner:
        return
    proc.kill()
    proc.wait()
    Path(folder, "socket").unlink(missing_ok=True)
    try:
        Path(folder).rmdir()
    except OSError:
        pass  # the server's own SIGTERM handler (_quit) removed it first


def _address(preload: tuple[str, ...]) -> str:
    with _lock:
        server = _servers.get(preload)
        if server is None or server[0].poll() is not None:
            folder = tempfile.mkdtemp(prefix="forked_cli")
            address = os.path.join(folder, "socket")
            proc = subprocess.Popen([sys.executable, "-m", "tests.forked_cli", address, ",".join(preload)], cwd=ROOT,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "tests.forked_cli died"
            atexit.register(_stop, proc, folder, os.getpid())
            server = _servers[preload] = (proc, address)
        return server[1]


def run_module(module: str, args: Sequence[str], cwd: Path | str, env: Mapping[str, str], timeout: float = 300,
               umask: int = -1, preload: Sequence[str] = PRELOAD) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in `cwd` with exactly `env` (and `umask`, unless -1), as subprocess.run(...,
    capture_output=True, text=True) would report it; forked from a server that imported `preload`."""
    command = [sys.executable, "-m", module, *args]
    conn: Connection = Client(_address(tuple(preload)), family="AF_UNIX")
    with conn:
        pid = conn.recv()
        conn.send((module, list(args), str(cwd), dict(env), umask))
        if not conn.poll(timeout):
            os.kill(pid, signal.SIGKILL)  # as subprocess.run kills its child (whose own children have its PDEATHSIG)
            raise subprocess.TimeoutExpired(command, timeout)
        try:
            code, stdout, stderr = conn.recv()
        except EOFError:
            raise AssertionError(f"the forked `{' '.join(command)}` died before it answered") from None
    return subprocess.CompletedProcess(command, code, stdout, stderr)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2].split(","))
