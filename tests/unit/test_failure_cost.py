"""What a run's GPU-time went to (contract/rundir/failure_cost.py, read by launcher/observe/run_cost.py), on ledgers
written here: a plain run restarted from its checkpoint after a crash, replica groups that heal a lost group, a
SLURM run's queue waits from sacct's times, and the checkpoint time the watchdog keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from contract.config.schema import WatchdogConfig
from contract.rundir import accounting, replicas
from contract.rundir.events import LOCAL_ATTEMPTS_FILE, read_events, record_event
from contract.rundir.failure_cost import Attempt, Lane, lane_cost, run_cost
from launcher import status
from launcher.checks.resume_checks import REQUIRED
from launcher.observe import run_cost as reader


def write_run(run_dir: Path, world: int, rows: list[tuple[int, float, float]], starts: list[tuple[int, float]],
              checkpoint_s: float | None = None, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run directory as the ranks leave it: metrics rows (step, time, step time), local attempts, plan.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "time": t, "loss": 1.0, "step_time_s": d}) + "\n" for s, t, d in rows))
    (run_dir / LOCAL_ATTEMPTS_FILE).write_text("".join(f"{n} {t:.3f} {'elsewhere'} 1\n" for n, t in starts))
    (run_dir / "plan.json").write_text(json.dumps({"world_size": world}))
    if checkpoint_s is not None:
        (run_dir / "watchdog.json").write_text(json.dumps({"longest_s": {}, "observations": {},
                                                           "spent_s": {"checkpoint": checkpoint_s}}))
    config = {**{section: {} for section in REQUIRED}, "run": {"name": run_dir.name},
              **(config or {"local": {"nproc": world}, "trainer": {"max_steps": rows[-1][0]}})}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return config


def test_a_plain_run_restarted_from_its_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """3 ranks, a step a second. Attempt 0 starts at 1000, steps 1-30 end at 1011-1040, checkpoint at 20, crash at
    1042 (its rows past step 20 were trimmed by the resume); 20 s later attempt 1 starts, first step (21) ends at
    1067, finishes step 50 at 1096 and ends at 1097. Saves took 2 s."""
    run_dir = tmp_path / "plain"
    rows = [(s, 1010.0 + s, 1.0) for s in range(1, 21)] + [(s, 1046.0 + s, 1.0) for s in range(21, 51)]
    config = write_run(run_dir, 3, rows, [(0, 1000.0), (1, 1062.0)], checkpoint_s=2.0)
    record_event(run_dir, "crashed", attempt=0, job=None, step=30, steps_lost=10, started=1000.0, ended=1042.0)
    record_event(run_dir, "finished", attempt=1, job=None, step=50, steps_lost=0, started=1062.0, ended=1097.0)
    cost = reader.cost(run_dir, config)
    assert cost is not None
    parts = cost["parts"]
    assert parts["trained"] == pytest.approx(3 * 50)  # steps 1-50 once
    assert parts["redone"] == pytest.approx(3 * 10)  # 21-30 trained twice
    assert parts["between"] == pytest.approx(3 * 20) and parts["queue"] == 0  # locally nothing waits in a queue
    assert parts["startup"] == pytest.approx(3 * 10)  # 1000 -> step 1 ended at 1011, less its second
    assert parts["restart"] == pytest.approx(3 * 4)  # 1062 -> step 21 ended at 1067, less its second
    assert parts["checkpoint"] == pytest.approx(3 * 2)
    inside = (1042 - 1000) + (1097 - 1062)
    assert parts["other"] == pytest.approx(3 * (inside - 50 - 10 - 10 - 4 - 2))
    assert cost["total"] == pytest.approx(3 * (1097 - 1000))  # the whole timeline, every rank
    assert cost["goodput"] == pytest.approx(150 / cost["total"])
    assert cost["failures"] == pytest.approx(3 * (4 + 20 + 10))
    notes = reader.cost_notes(run_dir, config, cost)
    assert "attempt 0 crashed at step 30" in notes[0] and "10 step(s) since its checkpoint trained again" in notes[0]
    assert "started 20.0 s later" in notes[0]
    assert notes[-1].startswith("GPU-time: 291 rank-s over 2 attempt(s) of 1 lane(s)") and "failures cost 102" in notes[-1]
    assert status.main([str(run_dir)]) == 0  # launcher.status prints them under its table
    shown = " ".join(capsys.readouterr().out.split())
    assert "plain: attempt 0 crashed at step 30" in shown and "plain: GPU-time: 291 rank-s" in shown
    assert status.main([str(run_dir), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["failure_cost"]["parts"]["redone"] == pytest.approx(30) and row["cost_notes"] == notes


def test_the_report_draws_what_the_time_went_to_after_a_failure_only(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from launcher import report
    from launcher.observe.cost_figure import cost_figure
    from launcher.observe.runs import find_runs

    test_a_plain_run_restarted_from_its_checkpoint(tmp_path, capsys)
    capsys.readouterr()
    run_dir = tmp_path / "plain"
    fig = cost_figure(find_runs(run_dir).runs, "t")
    assert fig is not None
    bars = fig.axes[0]
    assert [t.get_text() for t in bars.get_yticklabels()] == ["plain"]
    widths = [patch.get_width() for patch in bars.patches]
    cost = reader.cost(run_dir, yaml.safe_load((run_dir / "config.yaml").read_text()))
    assert cost is not None and widths[0] == pytest.approx(cost["goodput"]) and sum(widths) == pytest.approx(1.0)
    assert "attempt 0 crashed at step 30" in fig.axes[1].texts[0].get_text()
    assert report.main([str(run_dir)]) == 0
    assert str(run_dir / "goodput.png") in capsys.readouterr().out.splitlines()
    calm = tmp_path / "calm"  # one attempt, no failure: no figure
    write_run(calm, 1, [(s, 100.0 + s, 1.0) for s in range(1, 11)], [(0, 95.0)])
    record_event(calm, "finished", attempt=0, job=None, step=10, steps_lost=0, started=95.0, ended=111.0)
    assert cost_figure(find_runs(calm).runs, "t") is None


def test_replica_groups_heal_a_lost_group_and_the_survivors_stall_once(tmp_path: Path) -> None:
    """3 groups x 1 rank. Group 2 trains steps 1-20 and is killed; the launcher records its end at 1026 and starts it
    again at 1027; it heals and its first step (31) ends at 1040. The survivors' step 21 waited 3 s for the quorum
    to drop it; steps 21-30 trained without it."""
    run_dir = tmp_path / "groups"
    survivors = [(s, 1005.0 + s + (3 if s >= 21 else 0), 4.0 if s == 21 else 1.0) for s in range(1, 41)]
    config = {"local": {"nproc": 3}, "parallel": {"replica_groups": 3}, "trainer": {"max_steps": 40}}
    for g in (0, 1):
        write_run(replicas.group_dir(run_dir, g), 3, survivors, [(0, 1000.0)], config=config)
        record_event(replicas.group_dir(run_dir, g), "finished", attempt=0, job=None, step=40, steps_lost=0,
                     started=1000.0, ended=1049.0)
    lost = replicas.group_dir(run_dir, 2)
    write_run(lost, 3, [(s, 1005.0 + s, 1.0) for s in range(1, 21)] + [(s, 1009.0 + s, 1.0) for s in range(31, 41)],
              [(0, 1000.0), (1, 1027.0)], config=config)
    record_event(lost, "crashed", attempt=0, job=None, step=20, steps_lost=0, started=1000.0, ended=1026.0)
    record_event(lost, "finished", attempt=1, job=None, step=40, steps_lost=0, started=1027.0, ended=1049.0)
    record_event(run_dir, replicas.LOST, step=21, groups=[2])
    record_event(run_dir, replicas.REJOINED, groups=[2], lost_step=21, rejoined_step=31, reduced_steps=10,
                 seen=1026.0, heal_s=14.0, missed_samples=[[160, 168]])
    cost = reader.cost(run_dir, config)
    assert cost is not None and cost["lanes"] == 3 and cost["attempts"] == 4
    parts = cost["parts"]
    assert parts["trained"] == pytest.approx(40 + 40 + 30)  # group 2 missed steps 21-30
    assert parts["redone"] == 0  # it healed: nothing of its own trained again
    assert parts["between"] == pytest.approx(1.0)  # 1026 -> 1027, one rank
    assert parts["restart"] == pytest.approx(1040 - 1027 - 1)  # its heal, to its first step
    assert parts["stalled"] == pytest.approx(2 * 3.0)  # each survivor's step 21, beyond the median second
    assert cost["failures"] == pytest.approx(1 + 12 + 6)
    assert reader.cost_notes(run_dir, config, cost)[-1].startswith("GPU-time: ")
    # On SLURM group k is array task k: its requeue's wait in the queue is its own (sacct's rows for 57_2).
    on_slurm = reader.cost(run_dir, config, jobs=["57_0", "57_1", "57_2"], waits={"57_2": [3.0, 0.5]})
    assert on_slurm is not None and on_slurm["parts"]["queue"] == 0.5
    assert on_slurm["parts"]["between"] == pytest.approx(0.5) and on_slurm["failures"] == cost["failures"]
    line = replicas.failure_lines(read_events(run_dir), groups=3, steps=40)[0]
    assert "10 step(s) at reduced size (2 of 3 groups trained steps 21-30)" in line


def test_a_slurm_runs_queue_waits_come_from_sacct_and_are_part_of_the_time_between_attempts() -> None:
    text = ("37|2026-12-02T00:00:06|2026-12-02T00:00:06\n37|2026-12-02T00:00:36|2026-12-02T00:00:43\n"
            "38|2026-12-02T00:01:00|Unknown\n")
    waits = accounting.parse_queue_times(text)
    assert waits == {"37": [0.0, 7.0]}  # the pending job 38 has not started: no wait yet
    rows = [{"step": s, "time": 100.0 + s, "step_time_s": 1.0} for s in range(1, 11)]
    rows += [{"step": s, "time": 130.0 + s, "step_time_s": 1.0} for s in range(11, 21)]
    lane = Lane(ranks=8, attempts=[Attempt(90.0, 115.0, 12, 2, "crashed"), Attempt(125.0, 151.0, 20, 0, "finished")],
                rows=rows, useful_steps=20, queue_waits=waits["37"][1:])
    seconds = lane_cost(lane)
    assert seconds["queue"] == 7.0 and seconds["between"] == pytest.approx(10.0 - 7.0)
    assert seconds["redone"] == 2.0 and seconds["restart"] == pytest.approx(141 - 125 - 1)
    assert run_cost([lane])["parts"]["queue"] == 8 * 7.0  # every rank waits


def test_an_attempt_that_recorded_no_end_ends_at_its_last_row() -> None:
    from contract.rundir.failure_cost import attempts_of

    rows = [{"step": s, "time": 10.0 + s, "step_time_s": 1.0} for s in range(1, 6)]
    found = attempts_of([], [(0, 5.0)], rows)
    assert [(a.started, a.ended, a.step) for a in found] == [(5.0, 15.0, 5)]
    assert run_cost([Lane(1, [], [], 0)]) is None  # nothing timed
    from contract.rundir.failure_cost import step_time

    assert step_time([{k: v for k, v in r.items() if k != "step_time_s"} for r in rows]) == 1.0  # telemetry off


def test_the_watchdog_keeps_the_seconds_spent_in_saves_across_attempts(tmp_path: Path) -> None:
    from train.faults.watchdog import Watchdog

    node = OmegaConf.structured(WatchdogConfig)
    node.enabled = False
    cfg = OmegaConf.create({"watchdog": node})
    dog = Watchdog(cfg, 0, 1, tmp_path)
    dog.enabled = True
    for _ in range(2):
        with dog.section("checkpoint"):
            pass
    dog.save_state()
    first = reader.checkpoint_seconds(tmp_path)
    assert first is not None and first > 0
    again = Watchdog(cfg, 0, 1, tmp_path)
    again.enabled = True
    with again.section("checkpoint"):
        pass
    again.save_state()
    assert reader.checkpoint_seconds(tmp_path) > first  # summed over the attempts


def test_a_pause_the_user_chose_is_no_failure() -> None:
    """A local run finished at step 10, extended 40 s later to 20; then stopped with Ctrl-C at 25 and run again. No
    failure: no time between attempts, the start-ups are start-up's, and no attempt line (a new user's trial: the
    pause read as 'failures cost 42 rank-s (91.7%)')."""
    from contract.rundir.failure_cost import attempt_lines

    rows = [{"step": s, "time": 100.0 + s, "step_time_s": 1.0} for s in range(1, 11)]
    rows += [{"step": s, "time": 155.0 + s, "step_time_s": 1.0} for s in range(11, 26)]
    rows += [{"step": s, "time": 200.0 + s, "step_time_s": 1.0} for s in range(26, 31)]
    ended = [Attempt(95.0, 111.0, 10, 0, "finished"), Attempt(151.0, 181.0, 25, 0, "stopped"),
             Attempt(221.0, 231.0, 30, 0, "finished")]
    lane = Lane(ranks=2, attempts=ended, rows=rows, useful_steps=30)
    seconds = lane_cost(lane)
    assert seconds["between"] == 0 and seconds["restart"] == 0 and seconds["redone"] == 0
    assert seconds["startup"] == pytest.approx((101 - 95 - 1) + (166 - 151 - 1) + (226 - 221 - 1))
    cost = run_cost([lane])
    assert cost is not None and cost["failures"] == 0 and attempt_lines(lane) == []
    assert reader.cost_notes(Path("no-run"), {}, cost) == []  # no failure: status prints no cost line
    rows[12]["step_time_s"] = 9.0  # a straggling step alone is no failure either
    stalled = run_cost([lane])
    assert stalled is not None and stalled["parts"]["stalled"] > 0 and reader.cost_notes(Path("no-run"), {}, stalled) == []
    # Under SLURM a "stopped" end is SIGTERM, often a preemption that SLURM requeues: its pause is counted.
    ended[1].local = False
    assert lane_cost(lane)["between"] == pytest.approx(221 - 181)


@pytest.mark.parametrize(("plan", "config", "label"), [
    ({"accelerator": "CPU"}, {}, "CPU-time: "),
    ({"accelerator": "GPU"}, {}, "GPU-time: "),
    ({}, {"cluster": {"gpus_per_node": 0}}, "CPU-time: "),  # a run directory older than plan.json's accelerator
    ({}, {"cluster": {"gpus_per_node": 8}}, "GPU-time: "),
])
def test_the_breakdown_names_the_time_of_what_the_ranks_ran_on(tmp_path: Path, plan: dict[str, Any],
                                                                config: dict[str, Any], label: str) -> None:
    run_dir = tmp_path / "run"
    write_run(run_dir, 2, [(s, 1005.0 + s, 1.0) for s in range(1, 11)], [(0, 1000.0), (1, 1030.0)])
    (run_dir / "plan.json").write_text(json.dumps({"world_size": 2, **plan}))
    record_event(run_dir, "crashed", attempt=0, job=None, step=5, steps_lost=0, started=1000.0, ended=1010.0)
    config = {"local": {"nproc": 2}, "trainer": {"max_steps": 10}, **config}
    cost = reader.cost(run_dir, config)
    assert reader.cost_notes(run_dir, config, cost)[-1].startswith(label)


@pytest.mark.parametrize(("overrides", "accelerator"), [
    (["local.nproc=2"], None),  # this machine's
    (["+cluster=local_slurm"], "CPU"),  # gpus_per_node: 0
    (["+cluster=h100x8"], "GPU"),
])
def test_the_plan_records_what_the_ranks_run_on(overrides: list[str], accelerator: str | None) -> None:
    import torch

    from launcher.compose import compose_and_plan

    _, plan = compose_and_plan([*overrides, "launcher.dry_run=true"])
    assert plan.to_json()["accelerator"] == (accelerator or ("GPU" if torch.cuda.device_count() else "CPU"))
