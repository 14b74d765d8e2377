"""Watchdog timeouts: configured, or learned from the durations seen (kept across attempts); events and goodput."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from contract.config.schema import WatchdogConfig
from contract.rundir.events import counts, goodput, read_events, record_event, unexpected_failures
from train.faults.watchdog import MIN_OBSERVATIONS, Watchdog, culprit_host, least_progress


def _cfg(**overrides: object) -> object:
    node = OmegaConf.structured(WatchdogConfig)
    node.enabled = False  # no thread: the rules only
    for key, value in overrides.items():
        node[key] = value
    return OmegaConf.create({"watchdog": node})


def test_timeouts_are_configured_or_learned_and_kept_for_the_next_attempt(tmp_path: Path) -> None:
    dog = Watchdog(_cfg(startup_timeout_s=100.0, factor=4.0, min_timeout_s=2.0), 0, 1, tmp_path)
    assert dog.timeout("step") == 100.0  # nothing seen yet: the start-up timeout
    for seconds in (0.5, 1.5, 1.0)[:MIN_OBSERVATIONS]:
        dog.longest["step"] = max(dog.longest.get("step", 0.0), seconds)
        dog.seen["step"] = dog.seen.get("step", 0) + 1
    assert dog.timeout("step") == 6.0  # 4 x the longest step
    dog.enabled = True
    dog.save_state()
    again = Watchdog(_cfg(startup_timeout_s=100.0, factor=4.0, min_timeout_s=10.0), 0, 1, tmp_path)
    assert again.timeout("step") == 10.0  # learned 6 s, but never under the minimum
    fixed = Watchdog(_cfg(step_timeout_s=42.0), 0, 1, tmp_path)
    assert fixed.timeout("step") == 42.0


def test_events_count_failures_and_goodput_is_useful_step_time_over_attempt_time(tmp_path: Path) -> None:
    record_event(tmp_path, "preempted", started=0.0, ended=10.0)
    record_event(tmp_path, "crashed", started=20.0, ended=30.0)
    record_event(tmp_path, "hung", started=40.0, ended=60.0)
    record_event(tmp_path, "finished", started=70.0, ended=80.0)
    events = read_events(tmp_path)
    assert counts(events) == {"preempted": 1, "crashed": 1, "hung": 1, "finished": 1}
    assert unexpected_failures(tmp_path) == 2
    metrics = [{"step": s, "step_time_s": 0.5} for s in range(1, 41)]
    assert goodput(events, metrics) == 40 * 0.5 / 50  # 20 s of counted steps in 50 s of attempts
    assert goodput([], metrics) is None


def test_nccl_failure_handling_comes_from_the_cluster_config(tmp_path: Path) -> None:
    from contract.config.schema import ClusterConfig
    from train.distributed import nccl_env

    cluster = OmegaConf.structured(ClusterConfig(name="c", nccl_heartbeat_timeout_s=120,
                                                 nccl_flight_recorder_entries=500))
    env = nccl_env(cluster, tmp_path)
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "120" and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "hangs" / "nccl_trace_rank_")
    cluster.nccl_flight_recorder_entries = 0
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in nccl_env(cluster, tmp_path)


def test_the_rank_that_got_least_far_is_the_culprit_and_its_host_is_named() -> None:
    def dump(host: str, step: int, marks: int) -> dict[str, object]:
        return {"host": host, "last_finished_step": step, "marks": marks}

    # Rank 2 never loaded its micro batch while the others wait in backward's collective.
    headers = {0: dump("n1", 16, 2), 1: dump("n1", 16, 2), 2: dump("n2", 16, 0), 3: dump("n2", 16, 2)}
    assert least_progress(headers, 4) == [2] and culprit_host(headers, [2]) == "n2"
    # A rank a step behind is the culprit even with more marks.
    headers[1] = dump("n1", 15, 3)
    assert least_progress(headers, 4) == [1] and culprit_host(headers, [1]) == "n1"
    # A rank that wrote no dump (stuck where Python can't run) is the culprit.
    del headers[3]
    assert least_progress(headers, 4) == [3] and culprit_host(headers, [3]) is None
    # All equally far: nobody to blame, no host left out.
    same = {r: dump(f"n{r}", 16, 2) for r in range(3)}
    assert least_progress(same, 3) == [] and culprit_host(same, []) is None
    # Culprits on two hosts: no single host to leave out.
    two = {0: dump("n1", 16, 0), 1: dump("n2", 16, 0), 2: dump("n3", 16, 1)}
    assert least_progress(two, 3) == [0, 1] and culprit_host(two, [0, 1]) is None


def test_a_resume_settles_what_the_last_attempt_lost(tmp_path: Path) -> None:
    from contract.rundir.events import settle_steps_lost

    # Recorded at the crash: the newest complete checkpoint was step 5; step 10's async save completed after.
    record_event(tmp_path, "preempted", step=4, steps_lost=0)
    record_event(tmp_path, "crashed", step=11, steps_lost=6)
    settle_steps_lost(tmp_path, 10)
    assert [e["steps_lost"] for e in read_events(tmp_path)] == [0, 1]
    settle_steps_lost(tmp_path, 10)  # idempotent
    assert [e["steps_lost"] for e in read_events(tmp_path)] == [0, 1]
