"""A group option written with the wrong prefix (`cluster=x` for +cluster, `+strategy=fsdp` for strategy=), as one line
naming the right spelling, and the options when the name is not one of them.

Hydra words these for its own grammar ("Could not override 'cluster'. No match in the defaults list", "Multiple values
for strategy. To override a value use 'override strategy: fsdp'", "model appears more than once in the final
defaults list"). A group with a default in conf/config.yaml (model, data, ...) is chosen without `+`; one without
(cluster, profile, remote) is added with it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from launcher.checks.group_names import CONF_DIR, default_choices

_CONFIG_DIR = ("--config-dir", "-cd")


def _config_dirs() -> list[Path]:
    """conf/ and the project's --config-dir, as the command line names it."""
    argv, dirs = sys.argv[1:], [CONF_DIR]
    for i, arg in enumerate(argv):
        if arg in _CONFIG_DIR and i + 1 < len(argv):
            dirs.insert(0, Path(argv[i + 1]).expanduser())
        elif arg.startswith("--config-dir="):
            dirs.insert(0, Path(arg.split("=", 1)[1]).expanduser())
    return dirs


def options(group: str) -> list[str]:
    """A group's options: slurmtrain's and the project's (--config-dir)."""
    return sorted({p.stem for d in _config_dirs() for p in (d / group).glob("*.yaml")})


def _typed(group: str) -> str | None:
    """The option the command line gives the group (with or without +), or None."""
    for arg in sys.argv[1:]:
        name, _, value = arg.partition("=")
        if name.lstrip("+") == group and value:
            return value
    return None


def _spelled(group: str, option: str | None, plus: str) -> str:
    """`write +cluster=local_slurm`, or with a name that is no option, the options to choose from."""
    known = options(group)
    if option and option in known:
        return f"write {plus}{group}={option}"
    return f"write {plus}{group}=NAME, NAME one of {', '.join(known) or '(none: add ' + group + '/NAME.yaml)'}"


def group_prefix_problem(joined: str) -> str | None:
    """Hydra's words for a group option with the wrong prefix as one `error:` line, or None for anything else."""
    appended = re.search(r"Could not override '(\w+)'\. No match in the defaults list", joined)
    if appended:
        group = appended.group(1)
        option = _typed(group)
        return (f"error: {group}={option or '...'}: {group} has no default to override, so it is added with a +: "
                f"{_spelled(group, option, '+')}")
    twice = re.search(r"Multiple values for (\w+)\.|^(\w+) appears more than once in the final defaults list",
                      joined, re.M)
    if twice:
        group = twice.group(1) or twice.group(2)
        option = _typed(group)
        default = default_choices().get(group)
        has = f" ({default})" if default else ""
        return (f"error: +{group}={option or '...'}: {group} has a default{has}, so it is chosen without a +: "
                f"{_spelled(group, option, '')}")
    return None


def plus_on_a_missing_option(group: str) -> str | None:
    """`+model=nope`: the name is wrong and so is the +; None when the group has no default (the + is right)."""
    if group not in default_choices() or not any(a.startswith(f"+{group}=") for a in sys.argv[1:]):
        return None
    option = _typed(group)
    return f"error: +{group}={option}: no {group} option {option}, and {group} is chosen without a +: " \
           f"{_spelled(group, option, '')}"
