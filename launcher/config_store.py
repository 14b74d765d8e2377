"""The schema, our Hydra plugin and our --help registered with Hydra, before any config is composed."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from contract.config.schema import Config
from launcher.help import register_help
from launcher.sweeps.sweep import register_launcher


def register() -> None:
    register_launcher()
    register_help()
    # The top-level schema types every group's node, so group files are validated without schemas of their own
    # (which would also show up as bogus choices in Hydra's "Available options" list).
    ConfigStore.instance().store(name="schema", node=Config)
    # Hydra closes every dict, so a new key needs `+`; data.sources.NAME.path=... is how a mixture is typed: the
    # data groups take this node (conf/data/*.yaml), whose sources dict is open.
    sources = OmegaConf.create({"sources": {}})
    OmegaConf.set_struct(sources.sources, False)
    ConfigStore.instance().store(group="slurmtrain", name="open_sources", node=sources)
    # eval.sets.NAME.kind=... likewise, without `+` (conf/config.yaml puts this node at eval).
    eval_sets = OmegaConf.create({"sets": {}})
    OmegaConf.set_struct(eval_sets.sets, False)
    ConfigStore.instance().store(group="slurmtrain", name="open_eval_sets", node=eval_sets)
