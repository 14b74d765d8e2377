"""Checkpoints on the ranks (the layout and the COMPLETE marker are the contract's: contract/rundir/ckpt_layout.py).

    manager.py    CheckpointManager: save (every rank's shards, asynchronously), load, retention, the marker last,
                  the evaluation job handed each evaluated checkpoint
    manifest.py   each checkpoint's manifest/: its files' sizes and checksums, verified before a load
    early_check.py  checkpoint.verify_early: a checkpoint after step 1 written, read back, compared, deleted
"""
