"""Who stops when across replica groups (train/replicas/stops.py), with a fake clock: a stop every group of the
quorum asked for is taken together at one exchange, whatever steps the signals reached the groups at; one only
some groups asked for is taken by them alone once they have waited ALONE_WAIT_S, and never between exchanges
(DiLoCo's syncs). The runs themselves: tests/dist/test_replica_groups.py."""

from __future__ import annotations

from train.faults.preemption import NOTHING, REQUEUE, STOP
from train.replicas.stops import ALONE, ALONE_WAIT_S, TOGETHER, Asks, StopRule, kind_name


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _groups(n: int, clock: Clock) -> list[StopRule]:
    return [StopRule(g, clock=clock) for g in range(n)]


def _exchange(rules: list[StopRule], quorum: list[int]) -> None:
    """One committed exchange among the quorum's groups: each hears every member's ask."""
    asks = Asks({g: rules[g].pending for g in quorum if rules[g].pending != NOTHING}, len(quorum))
    for g in quorum:
        rules[g].heard(asks)


def _alone(expired: bool) -> bool:
    return expired  # one rank a group: its own clock is the group's


def _run(rules: list[StopRule], clock: Clock, signals: dict[int, tuple[int, int]], steps: int, step_s: float,
         quorum: list[int] | None = None, every: int = 1) -> dict[int, tuple[int, str, int]]:
    """Steps of `step_s` seconds; `signals`: group -> (the step boundary it agreed at, kind); an exchange every
    `every` steps. Returns group -> (step, decision, kind) for the groups that stopped."""
    quorum = list(range(len(rules))) if quorum is None else list(quorum)
    stopped: dict[int, tuple[int, str, int]] = {}
    for step in range(1, steps + 1):
        clock.now += step_s
        if step % every == 0:
            _exchange(rules, quorum)
        for g in list(quorum):
            at, kind = signals.get(g, (0, NOTHING))
            rules[g].ask(kind if at and step >= at else NOTHING)
            rules[g].newly_asked()  # as the session does, for its log
            decision, taken = rules[g].decide(_alone)
            if decision is not None:
                stopped[g] = (step, decision, taken)
        quorum = [g for g in quorum if g not in stopped]
        if not quorum:
            break
    return stopped


def test_a_whole_array_stop_is_taken_together_at_the_exchange_of_the_last_ask() -> None:
    clock = Clock()
    rules = _groups(3, clock)
    # The signals reach the groups within about a second, at boundaries 10, 11 and 13 (0.2 s steps).
    stopped = _run(rules, clock, {0: (10, STOP), 1: (11, REQUEUE), 2: (13, STOP)}, 100, 0.2)
    # Group 2's ask goes out with step 14's exchange: every group stops after step 14, the requeue winning.
    assert stopped == {g: (14, TOGETHER, REQUEUE) for g in range(3)}


def test_a_stop_only_one_group_asked_for_is_taken_by_it_alone_after_the_wait() -> None:
    clock = Clock()
    rules = _groups(3, clock)
    stopped = _run(rules, clock, {2: (10, STOP)}, 200, 0.2)
    # Asked at boundary 10 (t = 2.0 s); the first exchange once 5 s have passed is step 35's (t = 7.0 s).
    assert stopped == {2: (10 + round(ALONE_WAIT_S / 0.2), ALONE, STOP)}
    assert rules[2].waited_s >= ALONE_WAIT_S
    assert rules[0].seen == rules[1].seen == {2}  # the others heard it, and trained on


def test_a_group_left_alone_by_a_lost_peer_stops_at_once() -> None:
    """The quorum is what counts: a group whose peers are lost is every group of its quorum."""
    clock = Clock()
    rules = _groups(3, clock)
    stopped = _run(rules, clock, {1: (10, REQUEUE)}, 100, 0.2, quorum=[1])
    assert stopped == {1: (11, TOGETHER, REQUEUE)}


def test_a_stop_is_decided_only_at_an_exchange() -> None:
    """DiLoCo (an exchange every 10 steps of 1 s): a lone ask waits past its wait for the next sync; an ask that
    arrives in time for that sync makes it every group's stop."""
    clock = Clock()
    rules = _groups(2, clock)
    # Asked at boundary 19: at sync 20 it had waited 1 s, the wait ended at 24 s, it stops alone at sync 30.
    assert _run(rules, clock, {0: (19, STOP)}, 100, 1.0, every=10) == {0: (30, ALONE, STOP)}
    clock = Clock()
    rules = _groups(2, clock)
    assert _run(rules, clock, {0: (19, STOP), 1: (25, STOP)}, 100, 1.0, every=10) == {
        0: (30, TOGETHER, STOP), 1: (30, TOGETHER, STOP)}


def test_the_group_ranks_agree_that_the_wait_is_over() -> None:
    """One rank's clock past the wait is enough (the agreement is a max over the group's ranks), and the agreement is
    asked for only while the group waits, so that every rank of it takes part in each one."""
    clock = Clock()
    rule = StopRule(0, clock=clock)
    asked: list[bool] = []

    def agree(expired: bool) -> bool:
        asked.append(expired)
        return len(asked) == 2  # another rank's clock says so at the second exchange

    assert rule.decide(agree) == (None, NOTHING)  # nothing heard yet
    rule.ask(STOP)
    rule.heard(Asks({0: STOP}, 3))
    clock.now += 1.0
    assert rule.decide(agree) == (None, NOTHING) and asked == [False]
    assert rule.decide(agree) == (None, NOTHING) and asked == [False]  # no new exchange: nothing asked
    rule.heard(Asks({0: STOP}, 3))
    assert rule.decide(agree) == (ALONE, STOP) and asked == [False, False]


def test_the_signal_is_named() -> None:
    assert kind_name(STOP, "USR1") == "SIGTERM"
    assert kind_name(REQUEUE, "USR1") == kind_name(REQUEUE, "SIGUSR1") == "SIGUSR1"
