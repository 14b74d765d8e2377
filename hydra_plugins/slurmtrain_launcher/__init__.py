"""Hydra finds plugins only under the `hydra_plugins` namespace package: this makes `hydra/launcher=slurmtrain`
available to any Hydra app where slurmtrain is installed. The code lives in launcher/sweep.py."""

from launcher.sweep import SweepLauncher, register_launcher

register_launcher()


class SlurmtrainLauncher(SweepLauncher):
    pass
