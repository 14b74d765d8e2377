"""What can stop a run, and how it comes back.

    signals.py     the stop flag: handlers that only record which signal arrived (stdlib only)
    preemption.py  signal -> agreement across ranks -> save -> requeue -> exit
    watchdog.py    hang watchdog: a thread per rank timing the loop's sections, stack dumps when one overruns
    recovery.py    unexpected failures under SLURM: record the attempt's end, requeue within the failure budget
"""
