"""Refusals before anything runs: each a one-line `error:` that names the fix (exit code 2).

    key_checks.py       every key against the schema: declared, in its range, one of its values
    group_names.py      a section's name comes from the group option that set it (model=, data=, ...)
    overrides.py        the overrides the user typed, so that a refusal quotes what was typed
    hydra_errors.py     Hydra's own errors (a bad override, an unknown group option) as one line
    input_checks.py     what the user points at: the run root, token files, prepared datasets, a user's dataset
    cluster_checks.py   a cluster config, without a cluster: launch method, time limit, signal, secrets
    resume_checks.py    re-using a run directory means resuming it: what the directory holds must agree

The plan's own cross-field checks (world size, batch, memory, layout) are in launcher/plan/.
"""
