"""Refusals before anything runs: each a one-line `error:` that names the fix (exit code 2).

    key_checks.py       every key against the schema: declared, in its range, one of its values
    unread_keys.py      a key set that the chosen options never read (model.moe.* on a dense model): which choice reads it
    group_names.py      a section's name comes from the group option that set it (model=, data=, ...)
    overrides.py        the overrides the user typed, so that a refusal quotes what was typed
    hydra_errors.py     Hydra's own errors (a bad override, an unknown group option, a flag's bad choice) as one line
    group_choices.py    a group option with the wrong prefix (cluster=x, +strategy=fsdp): the right spelling, the options
    input_checks.py     what the user points at: the run root, token files, prepared datasets, a user's dataset
    cluster_checks.py   a cluster config, without a cluster: launch method, time limit, signal, secrets
    resume_checks.py    re-using a run directory means resuming it: what the directory holds must agree
    containers.py       container=...: the image, the runtime, slurmtrain inside the image; settles what the job runs
    container_probe.py  the image started once (here or as a one-task srun) and asked what it holds, cached

The plan's own cross-field checks (world size, batch, memory, layout) are in launcher/plan/.
"""
