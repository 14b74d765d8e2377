from __future__ import annotations

from train.distributed import MASTER_PORT_RANGE, detect, master_port_for_job


def test_slurm_variables_give_rank_world_and_master() -> None:
    env = detect({"SLURM_PROCID": "11", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3", "SLURM_JOB_NUM_NODES": "2",
                  "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[017-018]", "SLURMD_NODENAME": "gpu018"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (11, 3, 16, 8)
    assert env.master_addr == "gpu017" and env.launcher == "slurm" and env.node == "gpu018"
    assert env.master_port == master_port_for_job("4242_")
    assert MASTER_PORT_RANGE[0] <= env.master_port <= MASTER_PORT_RANGE[1]


def test_master_port_is_shared_within_a_job_and_differs_between_jobs() -> None:
    ports = {master_port_for_job(f"{job}_") for job in range(1000, 1050)}
    assert master_port_for_job("1000_") == master_port_for_job("1000_")
    assert len(ports) > 45  # two jobs on one node rarely collide


def test_torchrun_or_local_variables_win_and_bare_process_is_rank_0() -> None:
    env = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234",
                  "SLURMTRAIN_LAUNCHER": "local", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert (env.rank, env.world_size, env.master_addr, env.master_port, env.launcher) == (1, 2, "h", 1234, "local")
    bare = detect({})
    assert (bare.rank, bare.world_size, bare.launcher) == (0, 1, "single")
