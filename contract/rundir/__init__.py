"""The run directory's files: one reader and writer for each, shared by the launcher and the ranks.

    events.py           events.jsonl: each attempt's end and what happened within it; goodput
    metrics_file.py     metrics.jsonl: strict JSON rows, written by rank 0, read by status, report and sweeps
    accounting.py       what SLURM says of a job (squeue, sacct): its attempts and their waits in the queue
    failure_cost.py     what a run's GPU-time went to (trained, start-up, failures, checkpointing), from the ledger
    eval_results.py     eval/: evaluation jobs' results, pending markers and job ids
    measured.py         any metric a run measured, by step, and the complete checkpoint that measured best
    ckpt_layout.py      checkpoints/step_N/: layout, the COMPLETE marker, the newest complete checkpoint
    skipped_samples.py  skipped_samples.json: sample ranges no step trains on, and the rollbacks so far
    hf_export.py        export/hf_export.json: checkpoint.export_hf's export at the end of training, for status
    environment.py      failures of the environment (full disk, vanished run directory, OOM killer): kinds, lines
    env_faults.py       test-only injectors of those failures (pure stdlib)
    replicas.py         replica groups (parallel.replica_groups): their environment, lighthouse.json, the ledger of
                        lost groups in events.jsonl and its status lines
"""
