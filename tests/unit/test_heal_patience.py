"""A replica group started to heal whose first quorum holds no live group ahead of it (a live group held in a
collective with the lost one, or its heartbeat late on a loaded host: the lighthouse gives the healing group a quorum
of its own after the join timeout) asks again, and heals when a live group comes (train/replicas/session.py
_await_live_group). Only after heal_patience_s with none, or once the lighthouse has twice heard no other group's
heartbeat (they finished the run, or were lost too), does it exit EXIT_NO_PEER, to start from its checkpoint."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from contract.rundir import replicas as contract
from contract.rundir.replicas import EXIT_NO_PEER
from train.replicas import session as session_mod
from train.replicas.manager import VOTE_TIMEOUTS, heal_patience_s
from train.replicas.session import Replicas

PARALLEL = SimpleNamespace(replica_heartbeat_timeout_ms=1500, replica_join_timeout_ms=5000, replica_timeout_s=10,
                           lighthouse="127.0.0.1:29510")


class Manager:
    """torchft's Manager as the session sees it: each quorum, the step of the group ahead it healed from (0: none)."""

    def __init__(self, steps: list[int]) -> None:
        self.steps, self.step, self.quorums = steps, 0, 0

    def start_quorum(self) -> None:
        self.step = self.steps[min(self.quorums, len(self.steps) - 1)]
        self.quorums += 1

    def current_step(self) -> int:
        return self.step


def _healing(manager: Manager) -> Replicas:
    r = Replicas.__new__(Replicas)
    r.manager, r.heals, r.healed_at, r.group, r.main_dir = manager, True, None, 1, None
    r.env, r.cfg = SimpleNamespace(is_main=True), SimpleNamespace(parallel=PARALLEL)
    return r


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(session_mod.time, "sleep", slept.append)
    monkeypatch.delenv(contract.LIGHTHOUSE_ENV, raising=False)
    return slept


@pytest.fixture(autouse=True)
def heartbeats(monkeypatch: pytest.MonkeyPatch) -> list[set[int] | None]:
    """What the lighthouse says heartbeats, ask by ask (the last one repeated); by default groups 0 and 1."""
    said: list[set[int] | None] = [{0, 1}]
    asked: list[str] = []

    def live_groups(address: str, timeout_s: float = 5.0) -> set[int] | None:
        asked.append(address)
        return said[min(len(asked) - 1, len(said) - 1)]

    monkeypatch.setattr(contract, "live_groups", live_groups)
    return said


def test_the_patience_covers_a_live_group_held_in_a_step_with_the_lost_one() -> None:
    patience, pause = heal_patience_s(PARALLEL)
    # the commit vote of a step with the lost group, then the join timeout, the heartbeat a timeout late
    assert patience == VOTE_TIMEOUTS * 10 + 5 + 1.5 and pause == 0.75


def test_a_live_group_that_comes_late_is_healed_from(caplog: pytest.LogCaptureFixture, _no_sleep: list[float]) -> None:
    manager = Manager([0, 0, 0, 412])  # alone in three quorums, then the live group at step 412 is in it
    r = _healing(manager)
    with caplog.at_level(logging.INFO):
        assert r._quorum(SimpleNamespace(step=0)) is True
    assert r.healed_at == 0 and manager.quorums == 4 and len(_no_sleep) == 3
    text = caplog.text
    assert "no live group ahead of it yet: asking again for up to 26 s" in text
    assert "healed from a live group at step 0" in text and "exiting" not in text


def test_with_none_within_the_patience_it_exits_to_start_from_its_checkpoint(
        caplog: pytest.LogCaptureFixture, _no_sleep: list[float]) -> None:
    manager = Manager([0])
    r = _healing(manager)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as ended:
        r._quorum(SimpleNamespace(step=0))
    assert ended.value.code == EXIT_NO_PEER
    patience, pause = heal_patience_s(PARALLEL)
    assert sum(_no_sleep) >= patience and manager.quorums == 1 + math.ceil(patience / pause)
    assert "no live group is ahead of it after 26 s: exiting so that it starts from the checkpoint" in caplog.text


def test_a_group_not_started_to_heal_never_waits(_no_sleep: list[float]) -> None:
    manager = Manager([0])
    r = _healing(manager)
    r.heals = False  # a fresh start or a resume: alone in its first quorum is its start
    assert r._quorum(SimpleNamespace(step=0)) is False
    assert manager.quorums == 1 and _no_sleep == [] and r.healed_at == -1


def test_once_no_other_group_heartbeats_it_stops_asking(caplog: pytest.LogCaptureFixture,
                                                        heartbeats: list[set[int] | None]) -> None:
    # another group heartbeats, then the lighthouse cannot be reached (as if one did), then only this group, twice
    heartbeats[:] = [{0, 1}, None, {1}, {1}]
    manager = Manager([0])
    r = _healing(manager)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as ended:
        r._quorum(SimpleNamespace(step=0))
    assert ended.value.code == EXIT_NO_PEER and manager.quorums == 1 + 4
    assert "no other group heartbeats to the lighthouse: exiting so that it starts from the checkpoint" in caplog.text


def test_one_lone_answer_is_not_taken_for_the_end(heartbeats: list[set[int] | None]) -> None:
    heartbeats[:] = [{1}, {0, 1}, {1}, {0, 1}]  # a heartbeat late once in a while on a loaded host
    manager = Manager([0, 0, 0, 0, 0, 77])
    assert _healing(manager)._quorum(SimpleNamespace(step=0)) is True and manager.quorums == 6
