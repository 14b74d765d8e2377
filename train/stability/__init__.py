"""Training that notices when it goes wrong (issue 22): every optimizer update is checked on the device first.
Its settings are checked at launch by the contract (contract/rules/stability_checks.py); the skipped samples'
file is the contract's too (contract/rundir/skipped_samples.py).

    verdict.py     on the device, before the update: non-finite gradient norm, the spike rule; the skip flag that
                   makes the fused AdamW step a no-op, with no host synchronisation
    codes.py       each step's verdict to the host without waiting: pinned copies read once the device got there
    monitor.py     the host's counts and decision: nothing, roll back or stop (pure Python)
    rollback.py    reload the newest complete checkpoint satisfying a predicate, skip sample ranges, record why
    blowup.py      whether a loss blew up: far above the run's start or best (torch-free: launcher.status uses it)
    advice.py      the stop line's way on: what the losses say went wrong, and the command that fits it
    state_check.py no checkpoint from non-finite weights or optimizer state
    z_loss.py      the PaLM/OLMo auxiliary loss on the log-partition (optim.z_loss)
    fingerprint.py an exact fingerprint of tensors (two integers each: any flipped bit changes it)
    replicas.py    replica consistency: the ranks that should hold identical weights compare fingerprints, by vote
    corruption.py  what follows a disagreement: event, rollback to a verified checkpoint, or a requeue without the host
    runner.py      the loop's one object: the hooks train/loop.py calls
    faults.py      test-only injectors: NaN into one rank's gradients, a spike batch
    bit_flips.py   test-only injector: a flipped bit in one rank's weights
"""
