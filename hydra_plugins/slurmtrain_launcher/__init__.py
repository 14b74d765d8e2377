"""Hydra finds plugins only under the `hydra_plugins` namespace package: this makes `hydra/launcher=slurmtrain`
(and the sweeper that goes with it) available to any Hydra app where slurmtrain is installed. The code lives in
launcher/sweeps/sweep.py."""

import launcher.sweeps.sweep as _sweep

_sweep.register_launcher()


class SlurmtrainLauncher(_sweep.SweepLauncher):
    pass


class SlurmtrainSweeper(_sweep.SweepSweeper):
    pass


class SlurmtrainSearchSweeper(_sweep.SearchSweeper):
    pass
