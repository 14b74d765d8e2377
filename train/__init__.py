"""Compute-node side of slurmtrain: one process per rank (an srun task, a local worker, a torchrun process).

Started through `python -m launcher.worker` (launcher/worker.py), it reads the resolved config and the run
directory through the contract (contract/) and never imports launcher/.

    entry.py       a rank's main: the environment, the process group, the run's pieces, the loop
    loop.py        the training loop: resume, micro steps, the optimizer step, log, agree on stopping, save
    distributed.py rank, world and master address -> process group and device
    gc_control.py  Python's garbage collector frozen after set-up and run every trainer.gc_every steps
    loss.py        the loss over the targets that count (IGNORE_INDEX left out), with z-loss, plain or in chunks
                   (compiled with strategy.compile), and the tokens a step trains
    optim.py       the optimizer (optim.name) over its parameter groups (optim.no_decay), and its schedule
    optimizers/    Muon with AdamW, Adafactor on DTensor shards, SGD and Lion: what torch's classes can't do as we need
    model/         slurmtrain's transformer, a user's or a Hugging Face model built, probed, sampled
    data/          samples as a pure function of the global index: token files, mixtures, prefetching
    strategies/    one Strategy protocol, one module per backend (DDP, FSDP, DeepSpeed, TP, PP, context parallel)
    checkpoints/   writing, verifying and reading checkpoints; retention; evaluation jobs handed a checkpoint
    weights/       weights in and out: model.init_from, weight files, export
    evaluation/    validation sets and the pass; evaluation jobs' entry and submission
    stability/     non-finite steps, spikes, rollback, replica checks
    search/        a search's trial: its metric reported to the study at each evaluation, pruned there
    faults/        preemption, signals, hangs (watchdog), unexpected failures and requeue
    replicas/      replica groups over torchft: the cross-group average, healing from a live group, the ledger
    observe/       logs, metrics and wandb; telemetry (MFU, stragglers, profiles); measured memory
"""

from train.observe import quiet as _quiet

_quiet.import_notices()  # before any import of torchao (transformers imports it when installed): see quiet.py
