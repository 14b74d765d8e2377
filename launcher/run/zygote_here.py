"""The zygote of local ranks forked from the launcher itself, when the launcher's process has imported the compute
side already, instead of started as `python -m launcher.worker --fork-ranks FD` (launcher/run/rank_fork.py).

`python -m launcher` never imports torch, so a run started from the shell always takes the fresh zygote. A launcher
that runs in a process which imported torch and the training loop before it started (a test's warm server,
tests/forked_cli.py, or any program that imports both and calls the launcher) would otherwise start a second
interpreter only to import the same modules again: several CPU-seconds of every run on a small machine.

The forked zygote is what the fresh one would be: a session of its own, SIGUSR1 and SIGTERM held, SIGKILL should the
launcher die, only the descriptors it was passed, the zygote's environment, Python's own signal handlers, no exit
handlers and no root logging set up by the launcher. Each rank then runs `launcher.worker` on its command line and leaves
the process as the interpreter would leave it (exit handlers run, output flushed, the exit code), without ever
returning into the launcher's code.

It is taken only where forking is as safe as it is in the fresh zygote: this process runs no thread of its own (no
Python thread; no more native threads than importing torch starts), so no lock and no thread pool is copied half-way.
"""

from __future__ import annotations

import atexit
import gc
import io
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

# Importing torch starts one native thread of its own (it runs no operation): a process with more has run something.
_NATIVE_THREADS_OF_IMPORTS = 2
_COMPUTE_MODULES = ("torch", "train.entry", "train.loop")


class Forked:
    """The forked zygote as start_ranks waits for it (Popen's wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def can_fork() -> bool:
    """The compute side is imported here already and nothing runs beside this thread."""
    if not all(name in sys.modules for name in _COMPUTE_MODULES) or threading.active_count() != 1:
        return False
    try:
        return len(os.listdir("/proc/self/task")) <= _NATIVE_THREADS_OF_IMPORTS
    except OSError:
        return False


def fork_zygote(fd: int, passed: set[int], env: dict[str, str], before: Callable[[], None],
                serve: Callable[[int], list[str]], rank_main: Callable[[list[str]], int]) -> Forked | None:
    """Fork the zygote, which calls serve(fd) and, in each rank it returns in, runs rank_main (launcher.worker's
    main) on the rank's command line; None if fork failed."""
    for stream in (sys.stdout, sys.stderr):  # what the launcher wrote must not reach the zygote's copy of its buffers
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        return Forked(pid)
    code = 1
    try:
        os.setsid()
        before()
        _as_fresh(passed, env)
        argv = serve(fd)  # returns in each rank only; the zygote itself exits inside
        code = _run_rank(rank_main, argv)
    except BaseException:  # noqa: BLE001  (nothing may return into the launcher's frames)
        traceback.print_exc()
    finally:
        os._exit(code)


def close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process but `keep` (a forked child's close_fds)."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass


def _as_fresh(passed: set[int], env: dict[str, str]) -> None:
    """What a new interpreter would have: its descriptors, environment, signal handlers, no exit handlers or logging."""
    # Garbage that holds a descriptor is finalised now, not later in a rank, where the descriptor's number may be
    # another file's by then; what is still referenced stays so (the launcher's frames never return here).
    gc.collect()
    close_all_but({0, 1, 2, *passed})
    os.environ.clear()
    os.environ.update(env)
    # Python's standard streams on descriptors 1 and 2, as the interpreter opens them (unbuffered as PYTHONUNBUFFERED
    # asks); a rank makes its output file those descriptors later (rank_fork._become).
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding="utf-8",
                                            errors="backslashreplace" if fd == 2 else "strict",
                                            line_buffering=fd == 2, write_through=unbuffered))
    atexit._clear()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        want = signal.default_int_handler if sig == signal.SIGINT else \
            signal.SIG_IGN if sig in (signal.SIGPIPE, signal.SIGXFSZ) else signal.SIG_DFL
        try:
            if signal.getsignal(sig) is not want:
                signal.signal(sig, want)
        except (OSError, ValueError):
            pass
    # The root logger as a new interpreter has it. The libraries' own loggers keep what their imports set up (torch's
    # distributed loggers have handlers of their own and do not propagate): the rank would import them the same way.
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)


def _run_rank(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """`python -m launcher.worker ARGV` from here on: its exit code, once exit handlers ran and output is flushed."""
    module = sys.modules[main.__module__]
    sys.argv = [str(module.__file__), *argv]
    sys.modules["__main__"] = module  # as `python -m launcher.worker` has it (multiprocessing's spawn reads it)
    try:
        code = exit_code(main(argv))
    except SystemExit as exit_:
        code = exit_code(exit_.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    return code


def exit_code(code: object) -> int:
    """What the interpreter makes of `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
