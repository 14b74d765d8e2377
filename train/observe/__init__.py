"""What a rank reports.

    metrics.py     rank-tagged logging, metrics.jsonl rows (format: contract/rundir/metrics_file.py), wandb, the
                   rank-0 progress bar
    telemetry.py   step time, data wait, TFLOP/s and MFU, peak memory, stragglers, the profiler trace
    memory.py      what a rank really holds, measured, against the launch plan's estimate
    sync_count.py  host reads of device values per training step (the guard that a steady step reads none)
"""
