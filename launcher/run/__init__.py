"""Where a planned run goes and how it starts: this machine, SLURM, or (inside sbatch) only prepared.

    dispatch.py       one planned run sent where it runs (python -m launcher's last step, a local sweep point's)
    local.py          local debug mode: one worker process per rank on this machine
    local_ends.py     a local attempt's end that its ranks could not record (a second Ctrl-C, a silent rank 0)
    slurm.py          the cluster config as submitit/sbatch parameters; submission, dry-run scripts, following a job
    rundir.py         the run directory explains itself: resolved config, command, versions, git revision
    rundir_paths.py   what run.overwrite=true deletes, and the refusal of a run directory that can't be written
    eval_jobs.py      evaluation jobs (eval.async_jobs): which steps get one, their launch-time checks, the design
    eval_submit.py    an evaluation job's sbatch script and its submission (by training's rank 0)

The ranks themselves start through `python -m launcher.worker` (launcher/worker.py).
"""
