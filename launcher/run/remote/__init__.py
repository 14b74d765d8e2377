"""Remote submission (`+remote=NAME`): the same commands typed on a laptop run on a cluster's login node over SSH.

    config.py     +remote=NAME read from conf/remote/NAME.yaml (or a --config-dir), typed by contract/config/remote.py
    ssh.py        the one connection: the system ssh with a ControlMaster socket, ssh's failures as one line
    snapshot.py   the project directory as a content-addressed snapshot (contract/remote_snapshot.py), rsync'd once
    session.py    log in, check slurmtrain there (present, same version), run a command with its output here
    launch.py     `python -m launcher ... +remote=NAME`: ship the snapshot, run the command in it
    commands.py   status, report, sample, export, evaluate with +remote=NAME or NAME:PATH; PNGs and exports back
    hints.py      the status and report commands a submission prints, as the laptop types them (NAME:PATH)

docs/remote.md says how to use it; tests/slurm/test_remote.py runs it through a real sshd (make sshd-up).
"""
