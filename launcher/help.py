"""`python -m launcher --help`: what slurmtrain is, its config groups and their options, and the other commands.

Hydra prints `hydra.help.template` (conf/config.yaml), which is `${slurmtrain_help:...}`: this resolver's text. It
lists the groups of the config directories composed (ours and a user's --config-dir), not Hydra's ConfigStore
groups, so the internal `slurmtrain` group (launcher/config_store.py) stays out of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from launcher.commands import COMMANDS

RESOLVER = "slurmtrain_help"
ABOUT = """\
slurmtrain trains language models on one machine or a SLURM cluster with the same command. It composes a typed
config (model, data, optimizer, strategy, precision), checks every key and the plan (world size, memory, learning
rate, cost) before anything runs, then trains here with local worker processes, or with +cluster=NAME submits one
SLURM job whose ranks checkpoint on preemption and resume when requeued. -m sweeps become job arrays; status,
report, sample, export and evaluate read what the runs leave behind."""
USAGE = """\
usage: python -m launcher [GROUP=OPTION ...] [KEY=VALUE ...]    train on this machine
       python -m launcher +cluster=NAME [...]                   submit to SLURM (launcher.dry_run=true: plan only)
       python -m launcher -m KEY=A,B [...]                      a sweep: one run per combination"""
# Groups whose option is added rather than chosen over a default: +cluster=NAME, +profile=default.
OPTIONAL = ("cluster", "profile")


def _groups(sources: list[Any]) -> dict[str, list[str]]:
    """group -> its options, from every config directory composed (file sources: ours, then --config-dir's)."""
    out: dict[str, list[str]] = {}
    for source in sources:
        if source.get("schema") != "file":
            continue
        for group in sorted(p for p in Path(source["path"]).iterdir() if p.is_dir()):
            options = sorted(p.stem for p in group.glob("*.yaml"))
            if options:
                out.setdefault(group.name, [])
                out[group.name] += [o for o in options if o not in out[group.name]]
    return out


def help_text(sources: Any, choices: Any) -> str:
    sources = OmegaConf.to_container(sources) if OmegaConf.is_config(sources) else sources
    choices = OmegaConf.to_container(choices) if OmegaConf.is_config(choices) else choices
    lines = [ABOUT, "", USAGE, "", "== Config groups ==  (GROUP=OPTION; * the option in use)", ""]
    groups = _groups(list(sources))
    width = max(len(g) for g in groups) + 2
    for group, options in sorted(groups.items(), key=lambda item: (item[0] in OPTIONAL, item[0])):
        name = f"+{group}" if group in OPTIONAL else group
        chosen = choices.get(group)
        shown = ", ".join(f"{o}*" if o == chosen else o for o in options)
        lines.append(f"{name + ':':<{width}} {shown}")
    lines += ["", "Every key: python -m launcher --cfg job prints the composed config; docs/reference/config.md "
              "explains each.", "", "== Commands ==", ""]
    width = max(len(m) for m, _ in COMMANDS) + len("python -m ") + 2
    lines += [f"{'python -m ' + module:<{width}}{what}" for module, what in COMMANDS]
    lines += ["", "Each takes --help. Hydra's own flags (--cfg, --multirun, --config-dir, --info): "
              "python -m launcher --hydra-help"]
    # Hydra substitutes $NAMES in the template after this text is resolved: a literal dollar would break it.
    return "\n".join(lines).replace("$", "$$")


def register_help() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, help_text)
