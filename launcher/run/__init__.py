"""Where a planned run goes and how it starts: this machine, SLURM, or (inside sbatch) only prepared.

    dispatch.py       one planned run sent where it runs (python -m launcher's last step, a local sweep point's)
    local.py          local debug mode: one worker process per rank on this machine
    rank_fork.py      local ranks forked from one zygote that imported the compute side once (CPU ranks, Linux)
    zygote_here.py    that zygote forked from the launcher itself when its process imported the compute side already
    local_container.py  local ranks inside a container (container=...): each started fresh through the runtime
    local_ends.py     a local attempt's end that its ranks could not record (a second Ctrl-C, a silent rank 0)
    replica_groups.py local replica groups (parallel.replica_groups): a group lost is torn down and healed alone
    replica_slurm.py  replica groups on SLURM: one job array (a task per group, requeued alone) and its lighthouse
    lighthouse.py     torchft's lighthouse for replica groups: started (its binary), or checked; lighthouse.json
    lighthouse_keeper.py  the lighthouse of a SLURM run, on the login node or in a job of its own, while the array lives
    slurm.py          submission (sbatch parameters: contract/rules/sbatch.py), dry-run scripts, following a job,
                      SLURM's verdict on evaluation jobs (eval.async_jobs; the design: contract/rules/eval_jobs.py)
    rundir.py         the run directory explains itself: resolved config, command, versions, git revision
    rundir_paths.py   what run.overwrite=true deletes, and the refusal of a run directory that can't be written
    remote/           +remote=NAME: the same command on a cluster's login node over SSH, the project as a snapshot

The ranks themselves start through `python -m launcher.worker` (launcher/worker.py).
"""
