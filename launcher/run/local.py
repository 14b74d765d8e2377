"""Local debug mode: N worker processes on this machine, one per rank.

Why not torchrun: its agent dies on SIGUSR1 and owns the terminal; we need to forward the preemption signal,
show rank 0 live on the terminal and put every other rank in its own log file.

Rank 0 writes to the terminal (and to logs/rank_0.log); the other ranks write to logs/rank_N.log. If any
worker fails, the others are stopped and the failing worker's traceback is shown. Ctrl-C, SIGUSR1, SIGTERM or
SIGHUP to the launcher is forwarded to the workers as SIGUSR1 (checkpoint and exit); a second Ctrl-C stops them at
once (recorded as `killed`, launcher/run/local_ends.py), unless they have stopped already (ended, or rank 0 recorded
its stop): then it changes nothing. Signals within INTERRUPT_WINDOW_S of the first are that
same interrupt delivered again: GNU timeout, for one, signals its child and then its whole process group, so the
launcher gets one SIGINT twice at once; a second Ctrl-C that a person presses comes later.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from contract.errors import EXIT_DIVERGED, EXIT_KILLED, EXIT_STOPPED
from contract.rundir import environment as environment
from contract.rundir.events import is_secondary_text, record_environment_end
from launcher import worker
from launcher.plan.world import local_gpu_count
from launcher.run import local_container, local_ends, rank_fork

GRACE_S = 30.0
POLL_S = 0.1
INTERRUPT_WINDOW_S = 1.0
# Tests only: another window (0: every repeated SIGINT is a second Ctrl-C).
INTERRUPT_WINDOW_ENV = "SLURMTRAIN_TEST_INTERRUPT_WINDOW_S"


# Local ranks meet at a TCPStore that rank 0 hosts on a socket this launcher binds (port 0: the OS picks a free port
# at the moment it binds) and holds until the workers end; rank 0 gets the listening socket's descriptor under this
# name (train/distributed.py rendezvous_store). A port picked ahead, released and bound again later could be taken
# by another process in between.
STORE_FD_ENV = "SLURMTRAIN_STORE_FD"
LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


def listening_socket() -> socket.socket:
    """A socket bound to a port the OS picks and listening, for rank 0's store: the port stays ours throughout."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def worker_env(rank: int, nproc: int, port: int, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # A SLURM allocation around the launcher must not leak into local workers' rank detection.
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        SLURMTRAIN_LAUNCHER="local",
        PYTHONUNBUFFERED="1",
    )
    if rank == 0:
        env["SLURMTRAIN_LOG_FILE"] = str(run_dir / "logs" / "rank_0.log")
    return env


def _term_with_parent() -> None:
    """In the worker, before exec: SIGTERM it (checkpoint and stop) if the launcher dies without telling it, and
    hold the stop signals until train.entry has installed its handlers (it unblocks them): a Ctrl-C during
    start-up is then delivered to the handler instead of killing the interpreter."""
    rank_fork.hold_stops_and_die_with_parent(signal.SIGTERM)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class WorkerGroup:
    def __init__(self, config_path: Path, nproc: int, extra_env: dict[str, str] | None = None,
                 terminal: bool = True) -> None:
        self.config_path, self.nproc = config_path, nproc
        # Replica groups (launcher/run/replica_groups.py): the group's environment, and whether its rank 0 has the
        # terminal (only group 0's does; the others write to their log files).
        self.extra_env, self.terminal = dict(extra_env or {}), terminal
        self.run_dir = config_path.parent
        self.procs: list[subprocess.Popen[bytes] | rank_fork.Rank] = []
        self.log_paths: list[Path] = []
        self.started = time.time()  # the attempt's start, should rank 0 die before it notes its own
        # When the workers were last asked to checkpoint and stop; whether a second Ctrl-C then stopped them at once.
        self.stop_asked: float | None = None
        self.killed = False
        self.window = float(os.environ.get(INTERRUPT_WINDOW_ENV, INTERRUPT_WINDOW_S))
        # Outside the run directory, which may be the very thing that failed: where ranks leave their one-line
        # environmental endings (contract/rundir/environment.py) for this launcher to print once.
        self.ending_dir = Path(tempfile.mkdtemp(prefix="slurmtrain-endings-"))
        self.store_socket: socket.socket | None = None

    def start(self) -> None:
        # One process meets nobody: no socket is held for it. Port 0 lets a store that torch makes anyway (FSDP's
        # device mesh on one rank initialises a process group) bind a port the OS picks as it binds; a socket held
        # here on the port it reads would be in use (EADDRINUSE).
        container = local_container.spec_for(self.config_path, local_gpu_count() > 0, [self.ending_dir])
        if container is not None:  # each rank through the runtime; rank 0 binds the port (local_container.py)
            local_container.prepare(container)
        self.store_socket = listening_socket() if self.nproc > 1 and container is None else None
        port = int(self.store_socket.getsockname()[1]) if self.store_socket is not None else 0
        if container is not None and self.nproc > 1:
            port = local_container.free_port()
        listen_fd = self.store_socket.fileno() if self.store_socket is not None else -1
        argv = ["--config", str(self.config_path)]
        specs = []
        for rank in range(self.nproc):
            log_path = self.run_dir / "logs" / f"rank_{rank}.log"
            self.log_paths.append(log_path)
            env = worker_env(rank, self.nproc, port, self.run_dir)
            env[environment.ENDING_DIR_ENV] = str(self.ending_dir)
            env.update(self.extra_env)
            if rank == 0 and not self.terminal:
                env.pop("SLURMTRAIN_LOG_FILE", None)  # its output goes to that file already
            if rank == 0 and listen_fd >= 0:
                env[STORE_FD_ENV] = str(listen_fd)
            to_terminal = rank == 0 and self.terminal
            specs.append(rank_fork.RankSpec(argv, env, None if to_terminal else os.open(log_path, LOG_FLAGS, 0o644),
                                            (listen_fd,) if rank == 0 and listen_fd >= 0 else ()))
        try:
            if container is None and rank_fork.enabled(local_gpu_count()):
                zygote_env = {k: v for k, v in specs[0].env.items() if k != STORE_FD_ENV}
                self.procs = list(rank_fork.start_ranks(specs, zygote_env, rank_main=worker.main) or [])
            for spec in specs[len(self.procs):]:  # not forked: each rank a process of its own
                # Own session: the terminal's Ctrl-C reaches the launcher only, which decides what workers get.
                command = [sys.executable, "-m", "launcher.worker", *spec.argv] if container is None else \
                    local_container.rank_argv(container, spec.argv)
                self.procs.append(subprocess.Popen(
                    command, env=spec.env, stdout=spec.output_fd,
                    stderr=subprocess.STDOUT if spec.output_fd is not None else None, start_new_session=True,
                    preexec_fn=_term_with_parent, pass_fds=spec.keep_fds))
        finally:
            for spec in specs:
                if spec.output_fd is not None:
                    os.close(spec.output_fd)
        # A stop asked for while the ranks were starting (they had no pid yet): theirs now.
        if self.killed:
            self.signal_all(signal.SIGKILL)
        elif self.stop_asked is not None:
            self.signal_all(signal.SIGUSR1)

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def on_interrupt(self, signum: int, frame: FrameType | None, say: bool = True) -> None:
        """A stop asked of the launcher, passed to the workers; `say`: the line on the terminal (replica groups: once
        for all of them)."""
        now = time.monotonic()
        if self.stop_asked is not None and now - self.stop_asked < self.window:
            return  # the same interrupt, delivered again
        if signum == signal.SIGINT and self.stop_asked is not None:
            if self.settled():  # the stop is done: the workers are only exiting, and their end is recorded
                if say:
                    print("launcher: got SIGINT again: the workers have already stopped (their end is recorded); "
                          "waiting for them to exit", file=sys.stderr)
                return
            self.killed = True
            if say:
                print("launcher: got SIGINT again: stopping the workers now, without a checkpoint", file=sys.stderr)
            self.signal_all(signal.SIGKILL)
            return
        self.stop_asked = now
        if say:
            again = (" (Ctrl-C again to stop them now, losing the steps since the last checkpoint)"
                     if signum == signal.SIGINT else "")  # a SIGTERM (scancel, a batch shell) has no Ctrl-C to press
            print(f"launcher: got {signal.Signals(signum).name}, asking workers to checkpoint and stop{again}",
                  file=sys.stderr)
        self.signal_all(signal.SIGUSR1)

    def settled(self) -> bool:
        """Every worker has ended, or rank 0 recorded an end it reached by itself (launcher/run/local_ends.py)."""
        if len(self.procs) < self.nproc:  # still starting
            return False
        if all(p.poll() is not None for p in self.procs):
            return True
        return bool(self.procs) and local_ends.settled(self.run_dir, self.procs[0].pid, self.started)

    def stop(self, deadline_s: float = GRACE_S) -> None:
        self.signal_all(signal.SIGTERM)
        end = time.monotonic() + deadline_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def wait(self) -> int:
        """Wait for all workers; on the first failure stop the rest and report it."""
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0, EXIT_STOPPED, EXIT_DIVERGED)]
            if self.killed and failed:
                self.stop()
                return self.report_killed()
            if failed:
                rank, code = self.first_failure(failed)
                self.stop()
                ending = self.environment_ending(rank, code)
                if ending is not None:
                    print(ending, file=sys.stderr)
                    return environment.EXIT_ENVIRONMENT
                self.report_failure(rank, code)
                # Rank 0 records its attempt's end, even where a peer failed first; the launcher, where it died too.
                local_ends.record_end(self.run_dir, self.procs[0].pid, self.started, "crashed",
                                      error=f"rank {rank} {self.reason(code)}")
                return code if code > 0 else 128 - code
            if all(c is not None for c in codes):
                if any(c == EXIT_DIVERGED for c in codes):  # stability stopped the run: rank 0 said why, in one line
                    return EXIT_DIVERGED
                if any(c == EXIT_STOPPED for c in codes):
                    print(f"launcher: workers checkpointed and stopped; run the same command to resume "
                          f"(run directory {self.run_dir})", file=sys.stderr)
                    return EXIT_STOPPED
                return 0
            time.sleep(POLL_S)

    def first_failure(self, failed: list[tuple[int, int]]) -> tuple[int, int]:
        """Of the ranks found failed at one look, the one that failed first: a rank whose peer died fails too
        (its collective breaks), and may exit before the peer does; its log then ends with the peer's loss."""
        for rank, code in failed:
            if not is_secondary_text(tail(self.log_paths[rank])):
                return rank, code
        return failed[0]

    def environment_ending(self, rank: int, code: int) -> str | None:
        """The one line for a failure from outside the code, once every worker has ended: a rank's own (rank 0's
        first), a rank the kernel's OOM killer killed, or what is wrong with the run directory; None: another
        failure. Recorded as the attempt's end when the run directory takes a write."""
        endings = {}
        for path in self.ending_dir.glob("rank_*.json"):
            try:
                endings[int(path.stem.split("_")[1])] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
        host = socket.gethostname()
        fields: dict[str, object]
        # A rank the OOM killer took says nothing itself; its peers fail after it (they lost it).
        killed = [r for r, p in enumerate(self.procs) if p.returncode == -signal.SIGKILL]
        oom = next((r for r in killed if environment.oom_killed(self.procs[r].pid)), None)
        if endings:
            fields = endings[min(endings)]
        elif oom is not None:
            step = local_ends.last_logged_step(self.run_dir)
            fields = {"cause": environment.OOM_KILLED, "step": step, "host": host,
                      "message": environment.oom_killed_line(oom, host, step, self.run_dir)}
        else:
            problem = environment.run_dir_problem(self.run_dir, f"(rank {rank} on {host})")
            if problem is None:
                return None
            fields = {"cause": problem.cause, "message": problem.line, "host": host,
                      "step": local_ends.last_logged_step(self.run_dir)}
        try:
            number, started = local_ends.this_attempt(self.run_dir, self.procs[0].pid, self.started)
            fields.setdefault("started", started)
            fields.setdefault("ended", time.time())
            record_environment_end(self.run_dir, number, **fields)
        except OSError:
            pass  # the run directory takes no write: the line on the terminal is all there is
        return str(fields["message"])

    def cleanup(self) -> None:
        shutil.rmtree(self.ending_dir, ignore_errors=True)
        if self.store_socket is not None:
            self.store_socket.close()

    @staticmethod
    def reason(code: int) -> str:
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def report_failure(self, rank: int, code: int) -> None:
        print(f"launcher: rank {rank} failed ({self.reason(code)}); its log: {self.log_paths[rank]}", file=sys.stderr)
        if rank != 0:
            print(tail(self.log_paths[rank]), file=sys.stderr)

    def report_killed(self) -> int:
        """After the second Ctrl-C: the attempt's end (`killed`, unless a rank recorded its end first) and how to go
        on."""
        end = local_ends.record_end(self.run_dir, self.procs[0].pid, self.started, "killed")
        lost = "" if end is None else (f" at step {end['step']}; the {end['steps_lost']} step(s) since the last "
                                       "checkpoint are lost")
        print(f"launcher: workers stopped at once{lost}; run the same command to resume from the last checkpoint "
              f"(run directory {self.run_dir})", file=sys.stderr)
        return EXIT_KILLED


def run_local(config_path: Path, nproc: int,
              handled: Sequence[int] = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP),
              on_signal: Callable[[int], None] | None = None) -> int:
    """`on_signal`: told of each handled signal before the ranks are (a search worker's stop flag: a stop that comes
    as its trial ends must still keep it from taking the next)."""
    group = WorkerGroup(config_path, nproc)

    def handler(signum: int, frame: FrameType | None) -> None:
        if on_signal is not None:
            on_signal(signum)
        group.on_interrupt(signum, frame)

    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        group.start()
        print(f"launcher: started {nproc} worker(s); logs in {group.run_dir / 'logs'}", file=sys.stderr, flush=True)
        return group.wait()
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)
        if any(p.poll() is None for p in group.procs):
            group.stop()
        group.cleanup()
