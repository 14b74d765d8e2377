"""The replica groups' ledger (contract/rundir/replicas.py) and train/replicas/ledger.py writing it: which samples a
lost group's steps did not train, the steps at reduced size, the status lines and the group-step goodput."""

from __future__ import annotations

import json
from pathlib import Path

from contract.rundir import replicas


def test_a_groups_share_of_a_step_is_where_its_ranks_read() -> None:
    # 3 groups of 2 ranks, micro 4, accumulation 2: a step is 2 x 24 samples; group 1 reads ranks 2 and 3's.
    assert replicas.group_samples(480, 1, 3, 2, 4, 2) == [[488, 496], [512, 520]]
    assert replicas.merge_ranges([[8, 16], [0, 8], [24, 32]]) == [[0, 16], [24, 32]]


def test_the_ledger_records_a_loss_once_with_what_it_cost(tmp_path: Path) -> None:
    from train.replicas.ledger import Ledger

    books = [Ledger(tmp_path, g, 3, 1, 8, 1) for g in range(3)]
    for step in range(1, 11):
        present = [0, 1] if 4 <= step <= 6 else [0, 1, 2]
        for g, book in enumerate(books):
            if g in present:
                book.step(step, (step - 1) * 24, present, writes=True)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["replica_lost", "replica_rejoined"]  # written by group 0 alone
    lost, back = events
    assert lost["step"] == 4 and lost["groups"] == [2]
    assert back["lost_step"] == 4 and back["rejoined_step"] == 7 and back["reduced_steps"] == 3
    assert back["missed_samples"] == [[3 * 24 + 16, 4 * 24], [4 * 24 + 16, 5 * 24], [5 * 24 + 16, 6 * 24]]
    lines = replicas.failure_lines(events, groups=3, steps=10)
    assert "lost at step 4" in lines[0] and "rejoined at step 7" in lines[0] and "24 sample(s) not trained" in lines[0]
    assert replicas.group_goodput(events, 3, 10) == 1 - 3 / 30
    assert "90.0% of the 3 x 10 group-steps" in lines[1]


def test_a_loss_still_open_at_the_end_is_written_without_a_rejoin(tmp_path: Path) -> None:
    from train.replicas.ledger import Ledger

    book = Ledger(tmp_path, 0, 2, 1, 8, 1)
    book.step(1, 0, [0, 1], writes=True)
    book.step(2, 16, [0], writes=True)
    book.close(writes=True, present=[0])
    back = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()][-1]
    assert back["rejoined_step"] is None and back["reduced_steps"] == 1 and back["missed_samples"] == [[24, 32]]
    assert "never rejoined" in replicas.failure_lines([back])[0]
    # A group that stopped alone after step 1 (a signal reached only it): its loss from step 2 says so.
    left = {"kind": replicas.LEFT, "group": 1, "step": 1, "signal": "SIGTERM", "requeue": False, "groups_on": [0]}
    assert "lost at step 2 (group 1 stopped alone: SIGTERM reached only it) (seen" in replicas.failure_lines(
        [left, back])[0]
    assert "stopped alone" not in replicas.failure_lines([{**left, "step": 5}, back])[0]


def test_a_loss_is_closed_by_a_group_that_trained_through_it_not_by_the_one_that_healed(tmp_path: Path) -> None:
    """Group 0 lost at step 1 and healed at step 3: group 1, which trained through it, writes the rejoin."""
    from train.replicas.ledger import Ledger

    books = [Ledger(tmp_path, g, 2, 1, 8, 1) for g in range(2)]
    books[1].step(1, 0, [1], writes=True)
    books[1].step(2, 16, [1], writes=True)
    for book in books:  # group 0 is back (healed: its ledger is a new one)
        book.step(3, 32, [0, 1], writes=True)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["groups"]) for e in events] == [("replica_lost", [0]), ("replica_rejoined", [0])]
    assert events[1]["reduced_steps"] == 2 and events[1]["missed_samples"] == [[0, 8], [16, 24]]


def _events(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


def _named(events: list[dict]) -> set[int]:
    return {x for e in events if e["kind"] == "replica_rejoined" for a, b in e["missed_samples"] for x in range(a, b)}


def _share(g: int, steps: range, groups: int = 4, share: int = 8) -> set[int]:
    return {x for s in steps for x in range((s - 1) * groups * share + g * share, (s - 1) * groups * share + (g + 1) * share)}


def test_a_group_that_fell_behind_and_healed_in_place_does_not_write_the_loss(tmp_path: Path) -> None:
    """Measured (tests/dist/test_replica_failures.py): a kill inside step 10's all-reduce, which groups 1 and 2
    finished; group 0 fell behind and healed in place (its steps go 9, 11), group 3 was restarted and came back at
    step 12. One loss: groups 0 and 3 from step 10, each sample named once (before the fix group 0, unaware of step
    10, wrote a loss of group 3 from step 11, and group 1 deferred to it: step 10's shares were never named)."""
    from train.replicas.ledger import Ledger

    books = [Ledger(tmp_path, g, 4, 1, 8, 1) for g in range(4)]
    for step in range(1, 10):
        for book in books:
            book.step(step, (step - 1) * 32, [0, 1, 2, 3], writes=True)
    for book in books[1:3]:
        book.step(10, 9 * 32, [1, 2], writes=True)
    books[3] = Ledger(tmp_path, 3, 4, 1, 8, 1)  # started again: a new ledger, which sees only full steps here
    for step in range(11, 12):
        for book in books[:3]:
            book.step(step, (step - 1) * 32, [0, 1, 2], writes=True)
    for step in range(12, 14):
        for book in books:
            book.step(step, (step - 1) * 32, [0, 1, 2, 3], writes=True)
    events = _events(tmp_path)[-2:]
    assert [(e["kind"], e["groups"]) for e in events] == [("replica_lost", [0, 3]), ("replica_rejoined", [0, 3])]
    assert events[1]["lost_step"] == 10 and events[1]["rejoined_step"] == 12 and events[1]["reduced_steps"] == 2
    assert _named(events) == _share(0, range(10, 11)) | _share(3, range(10, 12))


def test_a_loss_whose_writer_is_lost_meanwhile_is_written_by_a_group_that_saw_it_all(tmp_path: Path) -> None:
    """Step 10 trained by groups 1 and 3 (group 0 heals in place; group 2 was killed); from step 11 group 1 is lost
    too (frozen) until all four are back at step 21. Group 1 wrote the loss's start; group 3 writes its end."""
    from train.replicas.ledger import Ledger

    books = [Ledger(tmp_path, g, 4, 1, 8, 1) for g in range(4)]
    for book in books:
        book.step(9, 8 * 32, [0, 1, 2, 3], writes=True)
    for book in (books[1], books[3]):
        book.step(10, 9 * 32, [1, 3], writes=True)
    for step in range(11, 21):
        for book in (books[0], books[3]):
            book.step(step, (step - 1) * 32, [0, 3], writes=True)
    books[1], books[2] = Ledger(tmp_path, 1, 4, 1, 8, 1), Ledger(tmp_path, 2, 4, 1, 8, 1)
    for book in books:
        book.step(21, 20 * 32, [0, 1, 2, 3], writes=True)
    events = _events(tmp_path)
    assert [(e["kind"], e["groups"]) for e in events] == [("replica_lost", [0, 2]), ("replica_rejoined", [0, 1, 2])]
    assert events[1]["lost_step"] == 10 and events[1]["rejoined_step"] == 21 and events[1]["reduced_steps"] == 11
    assert _named(events) == _share(0, range(10, 11)) | _share(2, range(10, 21)) | _share(1, range(11, 21))


def test_a_group_started_again_to_heal_writes_nothing_of_the_loss_it_healed_into(tmp_path: Path,
                                                                                 monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Group 0 was lost at step 5; started again (HEAL_ENV), it is present at step 7 while group 2 is still away:
    group 1, present throughout, writes the loss once (before the fix group 0, the lowest present, wrote a second
    loss from step 7 and group 1 deferred to it)."""
    from contract.rundir.replicas import HEAL_ENV
    from train.replicas.ledger import Ledger

    books = [Ledger(tmp_path, g, 3, 1, 8, 1) for g in range(3)]
    for step in range(5, 7):
        books[1].step(step, (step - 1) * 24, [1], writes=True)
    monkeypatch.setenv(HEAL_ENV, "1")
    books[0] = Ledger(tmp_path, 0, 3, 1, 8, 1)
    for book in books[:2]:
        book.step(7, 6 * 24, [0, 1], writes=True)
    books[2] = Ledger(tmp_path, 2, 3, 1, 8, 1)
    for book in books:
        book.step(8, 7 * 24, [0, 1, 2], writes=True)
    events = _events(tmp_path)
    assert [(e["kind"], e["groups"]) for e in events] == [("replica_lost", [0, 2]), ("replica_rejoined", [0, 2])]
    assert _named(events) == _share(0, range(5, 7), 3) | _share(2, range(5, 8), 3)
