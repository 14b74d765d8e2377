"""`+remote=NAME` (conf/remote/NAME.yaml, or a user's own under --config-dir): the cluster's login node, reached
over the system `ssh`, where the same `python -m launcher ...` runs (launcher/run/remote/)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from contract.config.keys import num


@dataclass
class RemoteConfig:
    # The remote's name: set by the group option (+remote=NAME), never typed.
    name: str = MISSING
    # The login node as ssh knows it: a host name or an alias of ~/.ssh/config (whose settings ssh applies).
    host: str = MISSING
    # ssh -l; None: what ~/.ssh/config says, else the local user name.
    user: str | None = None
    # ssh -p; None: what ~/.ssh/config says, else 22.
    port: int | None = num(None, 1, 65535)
    # ssh -J (ProxyJump): one or more hops, [user@]host[:port][,...]; None: what ~/.ssh/config says, else direct.
    jump: str | None = None
    # The cluster-side work directory: snapshots/ (the shipped code) and outputs/ (the runs) live under it. A
    # relative path is under the remote user's home.
    workdir: str = "slurmtrain"
    # Shell commands run before every remote command, in order, each on its own: what makes slurmtrain and sbatch
    # available there (`source ~/venvs/st/bin/activate`, `module load cuda`).
    setup: list[str] = field(default_factory=list)
    # The python that runs slurmtrain on the cluster, after the setup commands.
    python: str = "python"
    # An ssh config file (ssh -F) instead of ~/.ssh/config; None: ssh's own default.
    ssh_config: str | None = None
    # Extra ssh options, ssh -o KEY=VALUE each (e.g. UserKnownHostsFile, IdentityFile).
    ssh_options: dict[str, str] = field(default_factory=dict)
    # How long the shared connection stays open after the last command (ssh ControlPersist): one login (and one
    # second factor) serves every command within it.
    control_persist: str = "30m"
    # The largest project snapshot shipped, in MB; a bigger project is refused, naming what made it big.
    max_snapshot_mb: float = num(200.0, 0, lo_open=True)
    # Glob patterns left out of the snapshot besides the default ones (contract/remote_snapshot.py DEFAULT_EXCLUDE),
    # matched against each path below the project and each of its parts.
    exclude: list[str] = field(default_factory=list)
