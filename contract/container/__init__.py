"""Running the ranks inside a container image (container=pyxis|enroot|apptainer|charliecloud|podman): the command
lines, rendered from the config alone so that the launcher and the ranks (an evaluation job's script) agree.

    mounts.py     what the container sees of the host: the automatic mounts, the user's, each at its own path
    spec.py       a config's container section made concrete (image, mounts, variables, working directory, names)
    runtimes.py   each runtime's argv around the interpreter inside the image (a small table)
    job.py        a SLURM job's container: submitit's `python`, pyxis's srun flags, setup and teardown lines
    requeue.py    a requeue asked for inside a container, done by the batch shell outside it

The checks before anything runs (the image, the runtime, slurmtrain inside the image) are the launcher's:
launcher/checks/containers.py.
"""
