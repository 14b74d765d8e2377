"""Local ranks forked from one process that has imported torch and the training loop already, so that a run of N
ranks pays the start-up imports (~2.5 CPU-seconds: torch, torch._dynamo, the loop, distributed checkpointing) once
instead of N times, the way a forkserver does.

    launcher side  start_ranks(): starts `python -m launcher.worker --fork-ranks FD`, sends it each rank's command
                   line, environment and output over a socket pair, and gets back Rank handles: the part of
                   subprocess.Popen's interface WorkerGroup (launcher/run/local.py) uses
    zygote side    serve(): imports the compute side (launcher/compute_seam.py preload), then forks every rank and
                   returns, in each rank only, that rank's command line (launcher/worker.py runs it)

Each rank is forked twice: the middle process exits at once, so the rank is handed to the nearest subreaper, which
the launcher made itself (prctl PR_SET_CHILD_SUBREAPER) before starting the zygote. The launcher is then the rank's
parent, exactly as with subprocess: it waits for the rank's exit status (a signal's death included), signals it by
pid (a pid stays the rank's until the launcher reaps it), and the rank gets SIGTERM should the launcher die
(PR_SET_PDEATHSIG, set once the rank sees the launcher as its parent). Every rank is in a session of its own and
starts with SIGUSR1 and SIGTERM held until train/entry.py has its handlers in place, as the ranks subprocess starts.

Why forking there is safe: the zygote has run no torch operation (no intra-op threads yet) and initialised no CUDA
context; should an import have done so, each rank starts a fresh interpreter instead (exec). OpenBLAS stops its
threads around a fork. Python's `random` reseeds in each child; the loop seeds everything else itself.

On a machine with GPUs (enabled() says why), where the subreaper can't be set (not Linux), where
SLURMTRAIN_FORK_RANKS=0 asks for it, or when the zygote dies before it has started every rank, each rank starts as a
process of its own (launcher/run/local.py), as before.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.run import zygote_here

FORK_ENV = "SLURMTRAIN_FORK_RANKS"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_HELD = {signal.SIGUSR1, signal.SIGTERM}


@dataclass
class RankSpec:
    """One rank as the launcher would start it: `argv` after `python -m launcher.worker`, its whole environment,
    and the descriptor its stdout and stderr go to (None: the launcher's own, as rank 0's)."""

    argv: list[str]
    env: dict[str, str]
    output_fd: int | None = None
    keep_fds: tuple[int, ...] = ()


class Rank:
    """A forked rank, which is the launcher's child: Popen's pid, returncode, poll, wait, send_signal and kill."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 255
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(delay)  # a wait for the child's exit, polled: waitpid's own timeout doesn't exist
            delay = min(delay * 2, 0.05)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped: the pid is still this rank's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _prctl(option: int, value: int) -> bool:
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def enabled(gpus: int) -> bool:
    """Whether ranks are forked: asked (the default), CPU ranks, and this process can be its ranks' subreaper (Linux).

    Ranks on GPUs start fresh: a CUDA driver call before the fork (torch.cuda.is_available() without
    PYTORCH_NVML_BASED_CUDA_CHECK=1 is one) leaves CUDA unusable in the forked ranks, and no import may be trusted not
    to make one until the fork path has been verified on a GPU machine."""
    if gpus > 0 or os.environ.get(FORK_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return sys.platform.startswith("linux") and _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def hold_stops_and_die_with_parent(sig: int) -> None:
    """Before exec in a child the launcher starts: SIGUSR1 and SIGTERM held (train/entry.py unblocks them once its
    handlers are in place; a zygote's ranks inherit the mask), and `sig` should the launcher die."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    _prctl(_PR_SET_PDEATHSIG, sig)


def _zygote_preexec() -> None:
    """In the zygote: killed with the launcher."""
    hold_stops_and_die_with_parent(signal.SIGKILL)


ZYGOTE = ("-m", "launcher.worker", "--fork-ranks")


def start_ranks(specs: Sequence[RankSpec], zygote_env: dict[str, str], zygote: Sequence[str] = ZYGOTE,
                rank_main: Callable[[list[str]], int] | None = None) -> list[Rank] | None:
    """Fork every rank from one zygote (`python ZYGOTE FD`, which calls serve(FD, ...)); None, and no rank left
    running, if it could not start them all. With `rank_main` (launcher.worker's main, which ZYGOTE runs), a process
    that imported the compute side already forks the zygote from itself (zygote_here.py)."""
    ours, theirs = socket.socketpair()
    passed = {theirs.fileno(), *(s.output_fd for s in specs if s.output_fd is not None),
              *(fd for s in specs for fd in s.keep_fds)}
    process: subprocess.Popen[bytes] | zygote_here.Forked | None = None
    if rank_main is not None and zygote_here.can_fork():  # the compute side is imported here already: fork it
        process = zygote_here.fork_zygote(theirs.fileno(), passed, zygote_env, _zygote_preexec,
                                          lambda fd: serve(fd, _imported), rank_main)
    try:
        if process is None:
            process = subprocess.Popen([sys.executable, *zygote, str(theirs.fileno())],
                                       env=zygote_env, start_new_session=True, preexec_fn=_zygote_preexec,
                                       pass_fds=tuple(sorted(passed)))
    except OSError:
        ours.close()
        theirs.close()
        return None
    theirs.close()
    request = {"launcher": os.getpid(), "cwd": os.getcwd(),
               "ranks": [{"argv": s.argv, "env": s.env, "output_fd": s.output_fd, "keep_fds": list(s.keep_fds)}
                         for s in specs]}
    ranks: list[Rank] = []
    try:
        ours.sendall(json.dumps(request).encode())
        ours.shutdown(socket.SHUT_WR)
        with ours.makefile("r") as replies:
            for line in replies:  # one pid per rank, each written once the rank is this process's child
                ranks.append(Rank(int(line)))
    except (OSError, ValueError):
        pass
    finally:
        ours.close()
        process.wait()
    if len(ranks) == len(specs):
        return ranks
    for rank in ranks:  # a zygote that died half-way: none of its ranks runs alone
        rank.kill()
        rank.wait()
    return None


def _imported() -> None:
    """The forked zygote's preload: the compute side is imported already (zygote_here.can_fork)."""


def serve(fd: int, preload: Callable[[], None]) -> list[str]:
    """The zygote: import what every rank imports, fork each rank, exit. Returns only in a rank: its argv."""
    channel = socket.socket(fileno=fd)
    chunks = []
    while chunk := channel.recv(1 << 16):
        chunks.append(chunk)
    request = json.loads(b"".join(chunks))
    try:
        preload()
    except Exception:  # noqa: BLE001  (each rank imports again where it runs, and shows the error as a rank's own)
        pass
    fresh = _cuda_initialised()
    for spec in request["ranks"]:
        readable, writable = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.close(readable)
            rank = os.fork()
            if rank == 0:
                os.close(writable)
                channel.close()
                return _become(spec, request, fresh)
            os.write(writable, f"{rank}\n".encode())
            os._exit(0)
        os.close(writable)
        with os.fdopen(readable) as reply:
            pid = reply.read().strip()
        os.waitpid(middle, 0)  # the middle process is gone, so the rank is the launcher's child now
        channel.sendall(f"{pid}\n".encode())
    channel.close()
    os._exit(0)


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001  (a torch without CUDA)
        return False


def _become(spec: dict, request: dict, fresh: bool) -> list[str]:
    """In the forked rank: wait to be the launcher's child, then take the rank's session, descriptors and
    environment. The stop signals stay held (the zygote's mask) until train/entry.py unblocks them."""
    launcher, first = int(request["launcher"]), os.getppid()
    while os.getppid() == first and first != launcher:
        time.sleep(0.0005)  # the middle process exits right after forking this one
    if os.getppid() != launcher or not _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) or os.getppid() != launcher:
        os._exit(1)  # the launcher is gone already (nobody would supervise this rank), or won't be its parent
    os.setsid()
    out = spec["output_fd"]
    if out is not None:
        os.dup2(out, 1)
        os.dup2(out, 2)
    zygote_here.close_all_but({0, 1, 2, *spec["keep_fds"]})
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(spec["env"])
    argv: list[str] = list(spec["argv"])
    if fresh:  # an import initialised CUDA, which a fork must not inherit: a fresh interpreter instead
        os.execve(sys.executable, [sys.executable, "-m", "launcher.worker", *argv], spec["env"])
    sys.argv = [sys.argv[0], *argv]
    return argv
