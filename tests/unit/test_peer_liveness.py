"""train/replicas/liveness.py: a rank of a replica group that is frozen (SIGSTOP: alive, its sockets open, every
thread stopped) is seen by a live peer through the group's store, which then ends its group; a peer that ended
normally (its counter marked done) is never taken for frozen. Real processes and a real TCPStore; the waits are
for events (a tick count, the verdict), bounded generously."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from train.replicas.liveness import DONE, PeerLiveness

TIMEOUT_S, TICK_S = 3.0, 0.2
PEER = """
import sys, time
from train.replicas.liveness import PeerLiveness
live = PeerLiveness("127.0.0.1", int(sys.argv[1]), 1, 2, 60.0, 0, exit_fn=lambda *a: None, tick_s=0.2).start()
if sys.argv[2] == "done":
    while live.ticks < 5:
        time.sleep(0.05)
    live.stop()  # ends normally
else:
    time.sleep(3600)  # ticks until the test freezes it
"""


def _wait(what: str, condition, limit_s: float = 60.0) -> None:  # noqa: ANN001
    done = threading.Event()
    for _ in range(int(limit_s / 0.05)):
        if condition():
            return
        done.wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def _watcher(store: dist.TCPStore, verdicts: list[tuple[int, float]]) -> PeerLiveness:
    return PeerLiveness("127.0.0.1", int(store.port), 0, 2, TIMEOUT_S, 0,
                        exit_fn=lambda peer, silent, _: verdicts.append((peer, silent)), tick_s=TICK_S).start()


def test_a_frozen_peer_is_seen_and_ends_the_group(store: dist.TCPStore) -> None:
    verdicts: list[tuple[int, float]] = []
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(store.port), "freeze"], cwd=os.getcwd())
    watcher = _watcher(store, verdicts)
    try:
        _wait("the peer's ticks seen", lambda: watcher._seen.get(1, (0, 0))[0] >= 3)
        os.kill(peer.pid, signal.SIGSTOP)
        _wait("the verdict", lambda: bool(verdicts), limit_s=TIMEOUT_S * 10)
    finally:
        watcher.stop()
        peer.kill()
        peer.wait()
    assert verdicts[0][0] == 1 and verdicts[0][1] > TIMEOUT_S


def test_a_peer_that_ended_normally_is_not_taken_for_frozen(store: dist.TCPStore) -> None:
    verdicts: list[tuple[int, float]] = []
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(store.port), "done"], cwd=os.getcwd())
    watcher = _watcher(store, verdicts)
    try:
        _wait("the peer marked done", lambda: watcher._seen.get(1, (0, 0))[0] == DONE)
        assert peer.wait(timeout=60) == 0
        seen = watcher.ticks
        # Twice the timeout's worth of the watcher's own ticks after the peer ended: no verdict.
        _wait("the watcher's ticks", lambda: watcher.ticks >= seen + 2 * TIMEOUT_S / TICK_S)
    finally:
        watcher.stop()
        if peer.poll() is None:
            peer.kill()
    assert verdicts == []
