"""The run directory's files: one reader and writer for each, shared by the launcher and the ranks.

    events.py           events.jsonl: each attempt's end and what happened within it; goodput
    metrics_file.py     metrics.jsonl: strict JSON rows, written by rank 0, read by status, report and sweeps
    accounting.py       what SLURM says of a job (squeue, sacct)
    eval_results.py     eval/: evaluation jobs' results, pending markers and job ids
    measured.py         any metric a run measured, by step, and the complete checkpoint that measured best
    ckpt_layout.py      checkpoints/step_N/: layout, the COMPLETE marker, the newest complete checkpoint
    skipped_samples.py  skipped_samples.json: sample ranges no step trains on, and the rollbacks so far
    hf_export.py        export/hf_export.json: checkpoint.export_hf's export at the end of training, for status
    environment.py      failures of the environment (full disk, vanished run directory, OOM killer): kinds, lines
    env_faults.py       test-only injectors of those failures (pure stdlib)
"""
