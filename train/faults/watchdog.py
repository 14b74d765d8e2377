"""Hang watchdog: a thread on every rank that watches the training loop's sections against their timeouts.

Sections: `startup` (process start through the end of the first step), `step` (each later step), `checkpoint` (a
save's blocking part). A timeout is configured (`watchdog.*_timeout_s`) or learned: `watchdog.factor` x the
longest duration seen so far (at least `watchdog.min_timeout_s`), kept in RUN_DIR/watchdog.json for the next
attempt. When a section overruns, the rank writes every thread's Python stack to RUN_DIR/hangs/ with the step it
last finished, logs it and exits with EXIT_HUNG: no rank sits in a dead collective until the time limit. The other
ranks, blocked in the same collective, overrun the same section and do the same.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from contract.rundir.failure_cost import WATCHDOG_FILE as STATE_FILE
from train.observe.metrics import log

EXIT_HUNG = 86
HANGS_DIR = "hangs"
# Fault injection for tests, "RANK:STEP[:ATTEMPT]" (ATTEMPT: SLURM_RESTART_COUNT, default any): RANK stops making
# progress in that step (sleeps forever), or raises there.
TEST_HANG_ENV = "SLURMTRAIN_TEST_HANG"
TEST_RAISE_ENV = "SLURMTRAIN_TEST_RAISE"


def _injection(name: str, rank: int) -> int | None:
    """The step at which this rank is to fail, from a test's fault-injection variable."""
    spec = os.environ.get(name)
    if not spec:
        return None
    parts = [int(x) for x in spec.split(":")]
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    if parts[0] != rank or (len(parts) > 2 and parts[2] != attempt):
        return None
    return parts[1]
# A learned timeout needs this many observations first; until then the start-up timeout applies.
MIN_OBSERVATIONS = 3


# How long rank 0 waits for the other ranks' dumps before it summarises.
SUMMARY_WAIT_S = 5.0


def _main_thread_at() -> str:
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def least_progress(headers: dict[int, dict[str, Any]], world_size: int) -> list[int]:
    """The ranks that got least far: those that wrote no dump (stuck where Python can't run, or gone) when others
    did, else those whose (last finished step, progress marks) is lowest when not all are equal. Empty: no rank
    stands out."""
    silent = [r for r in range(world_size) if r not in headers]
    if silent and headers:
        return silent
    if len(headers) < 2:
        return []
    progress = {r: (int(h.get("last_finished_step", 0)), int(h.get("marks", 0))) for r, h in headers.items()}
    low = min(progress.values())
    if low == max(progress.values()):
        return []
    return sorted(r for r, p in progress.items() if p == low)


def culprit_host(headers: dict[int, dict[str, Any]], culprits: list[int]) -> str | None:
    """The one host of the culprit ranks (None: unknown, or spread over several hosts)."""
    hosts = {headers[r]["host"] for r in culprits if r in headers}
    return hosts.pop() if len(hosts) == 1 and len(culprits) == len([r for r in culprits if r in headers]) else None


def hang_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HANGS_DIR


class Watchdog:
    def __init__(self, cfg: Any, rank: int, world_size: int, run_dir: Path, on_hang: Any = None) -> None:
        w = cfg.watchdog
        self.cfg, self.rank, self.world_size, self.run_dir = w, rank, world_size, Path(run_dir)
        self._settings: dict[str, Any] = {}
        self.enabled = bool(w.enabled)
        self.on_hang = on_hang  # called (section, elapsed, step, culprit host) before the rank exits: it records
        self.longest: dict[str, float] = {}
        self.seen: dict[str, int] = {}
        # Seconds spent in each section over the run's attempts (checkpoint: what saves cost the training thread;
        # contract/rundir/failure_cost.py reads it).
        self.spent: dict[str, float] = {}
        self._load()
        self.last_step = 0
        # Progress inside the current step (data loaded, forward done, ...): ranks that hang together are told
        # apart by how far each got; the one that got least far is the culprit.
        self.marks = 0
        self._section: tuple[str, float, float] | None = None  # name, started (monotonic), timeout
        self._started_wall = time.time()
        self._stop = threading.Event()
        self._fired = threading.Event()
        self._thread: threading.Thread | None = None
        # Tests may confine an injection to runs whose directory name holds SLURMTRAIN_TEST_ONLY_IN (one sweep point).
        only = os.environ.get("SLURMTRAIN_TEST_ONLY_IN")
        injected = not only or only in self.run_dir.name
        self._test_hang = _injection(TEST_HANG_ENV, rank) if injected else None
        self._test_raise = _injection(TEST_RAISE_ENV, rank) if injected else None
        if self.enabled:
            self.enter("startup")
            self._thread = threading.Thread(target=self._watch, name="slurmtrain-watchdog", daemon=True)
            self._thread.start()

    # -- what the loop calls ------------------------------------------------------------------------------
    def timeout(self, section: str) -> float:
        configured = self._setting(f"{section}_timeout_s")
        if configured:
            return float(configured)
        if section != "startup" and self.seen.get(section, 0) >= MIN_OBSERVATIONS:
            return max(float(self._setting("min_timeout_s")), float(self._setting("factor")) * self.longest[section])
        return float(self._setting("startup_timeout_s"))

    def _setting(self, key: str) -> Any:
        """A watchdog.* value (None where unset), read from the config once: every step enters a section, and an
        OmegaConf read costs tens of microseconds."""
        try:
            return self._settings[key]
        except KeyError:
            value = self._settings[key] = getattr(self.cfg, key, None)
            return value

    def enter(self, section: str) -> None:
        if self.enabled:
            self._section = (section, time.monotonic(), self.timeout(section))

    def leave(self) -> None:
        current = self._section
        self._section = None
        if current is None:
            return
        name, started, _ = current
        elapsed = time.monotonic() - started
        if name != "startup":
            self.longest[name] = max(self.longest.get(name, 0.0), elapsed)
            self.seen[name] = self.seen.get(name, 0) + 1
            self.spent[name] = self.spent.get(name, 0.0) + elapsed

    def mark(self) -> None:
        self.marks += 1

    def step_started(self, step: int) -> None:
        """Step `step` (1-based) begins; the first one of an attempt still counts as start-up."""
        self.marks = 0
        if self._section is None or self._section[0] != "startup":
            self.enter("step")
        if self._test_hang == step:
            log.warning("rank %d stops making progress in step %d (%s)", self.rank, step, TEST_HANG_ENV)
            while True:  # a rank that stops making progress, for the tests
                time.sleep(1)
        if self._test_raise == step:
            raise RuntimeError(f"injected failure on rank {self.rank} at step {step} ({TEST_RAISE_ENV})")

    def step_finished(self, step: int) -> None:
        self.last_step = step
        self.leave()

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """A section of its own (checkpoint, validation). Inside another (a validation pass within a step, or at
        step 0 within start-up), the outer one resumes afterwards with the inner time left out of it."""
        outer = self._section
        started = time.monotonic()
        self.enter(name)
        try:
            yield
        finally:
            self.leave()
            if outer is not None and self.enabled:
                self._section = (outer[0], outer[1] + time.monotonic() - started, outer[2])

    def save_state(self) -> None:
        """Rank 0 keeps what was learned for the next attempt."""
        if self.enabled and self.rank == 0:
            data = {"longest_s": self.longest, "observations": self.seen, "spent_s": self.spent}
            tmp = self.run_dir / f".{STATE_FILE}.tmp"
            tmp.write_text(json.dumps(data) + "\n")
            tmp.rename(self.run_dir / STATE_FILE)

    def close(self) -> None:
        self._stop.set()
        self._section = None

    # -- the thread -----------------------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            data = json.loads((self.run_dir / STATE_FILE).read_text())
            self.longest = {k: float(v) for k, v in data["longest_s"].items()}
            self.seen = {k: int(v) for k, v in data["observations"].items()}
            self.spent = {k: float(v) for k, v in data.get("spent_s", {}).items()}
        except (OSError, ValueError, KeyError, AttributeError):
            pass

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            current = self._section
            if current is None:
                continue
            name, started, timeout = current
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                self._fire(name, elapsed, timeout)

    def _wait_for_dumps(self, folder: Path) -> dict[int, dict[str, Any]]:
        """The other ranks overrun the same section within moments: wait for their dumps before exiting, so that
        no rank's exit breaks a peer's collective (an error there) before that peer's own dump."""
        deadline = time.monotonic() + SUMMARY_WAIT_S
        headers: dict[int, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            for path in folder.glob("rank*.txt"):
                try:
                    headers[int(path.stem[4:])] = json.loads(path.read_text().splitlines()[0])
                except (OSError, ValueError, IndexError):
                    continue
            if len(headers) >= self.world_size:
                break
            time.sleep(0.2)
        return headers

    def _summarise(self, headers: dict[int, dict[str, Any]], culprits: list[int]) -> None:
        """Rank 0 says where every rank was, and which got least far."""
        for rank in range(self.world_size):
            h = headers.get(rank)
            if h is None:
                log.error("hang: rank %d wrote no stack dump (it may have died, or hangs where Python can't run)", rank)
            else:
                log.error("hang: rank %d on %s last finished step %d (progress %d into the next); its main thread "
                          "was at %s", rank, h["host"], h["last_finished_step"], h.get("marks", 0), h["main_thread_at"])
        if culprits:
            log.error("hang: rank(s) %s made the least progress: the likely cause", ",".join(map(str, culprits)))
        else:
            log.error("hang: every rank got equally far: no single rank to blame")

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def let_it_finish(self) -> None:
        """The main thread, failing because a peer's watchdog ended it, leaves the exit to this rank's watchdog
        (which dumps, summarises and records the hang)."""
        if self._thread is not None:
            self._thread.join()

    def _fire(self, section: str, elapsed: float, timeout: float) -> None:
        self._fired.set()
        folder = hang_dir(self.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}.txt"
        host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        header = {"rank": self.rank, "host": host, "pid": os.getpid(), "section": section,
                  "elapsed_s": round(elapsed, 3), "timeout_s": round(timeout, 3), "last_finished_step": self.last_step,
                  "marks": self.marks,
                  "entered_at": time.time() - elapsed, "fired_at": time.time(), "main_thread_at": _main_thread_at(),
                  "slurm_job": os.environ.get("SLURM_JOB_ID")}
        with open(path, "w") as f:
            f.write(json.dumps(header) + "\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        log.error("HANG: no progress in section %s for %.0f s (timeout %.0f s); last finished step %d; every thread's "
                  "stack is in %s", section, elapsed, timeout, self.last_step, path)
        headers = self._wait_for_dumps(folder)
        culprits = least_progress(headers, self.world_size)
        if self.rank == 0:
            self._summarise(headers, culprits)
        if self.on_hang is not None:
            try:
                self.on_hang(section, elapsed, self.last_step, culprit_host(headers, culprits))
            except Exception:  # the exit below matters more than the record
                log.exception("recording the hang failed")
        for handler in log.handlers:
            handler.flush()
        os._exit(EXIT_HUNG)
