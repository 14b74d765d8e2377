"""Benchmarks: `python -m bench [NAME ...]` (make bench) measures each as ratios within one run and writes the report.

    __main__.py    runs the benchmarks named in registry.py, then the report
    registry.py    the benchmarks' names and modules, and where their results go (bench/results/)
    report.py      report.json, REPORT.md and report.png from the stored results (nothing measured there)
    bare_loop.py   the bare PyTorch loop the loop benchmarks measure ours against, and a one-rank process group
    loop_overhead.py, loop_overhead_gpu.py   our loop against the bare loop: CPU ranks (1 and DDP 2), one GPU
    gpu_check.py, gpu_profile.py             make gpu-check on a lent GPU; torch.profiler of both loops there
    stop_agreement_ab.py   what the per-step stop agreement costs a tiny DDP step, within each run (a diagnostic)
    ports.py       a rendezvous port for a benchmark's ranks
    the others     one benchmark each (checkpoint_stall, submit_latency, memory_estimate, telemetry_overhead,
                   preemption_turnaround, prepare_throughput, data_scale, validation_cost, stability_overhead,
                   replica_check, sweep_planning, sample_cache, grad_compression, loss_cost): its docstring says
                   what it measures
"""
