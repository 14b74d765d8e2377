"""The one source of truth for every config key.

Every YAML file under conf/ only sets values declared here; Hydra validates keys and types at compose time
because the dataclasses below (the sections' are in training.py and operations.py) are registered in
its ConfigStore and named in each file's defaults list.
This module imports nothing heavy: the launcher must stay torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from contract.config.container import ContainerConfig
from contract.config.keys import SEED_MAX, num, path_key
from contract.config.operations import (
    CheckpointConfig,
    ClusterConfig,
    EvalConfig,
    LauncherConfig,
    LocalConfig,
    LoggerConfig,
    ProfileConfig,
    RunConfig,
    StabilityConfig,
    TelemetryConfig,
    WatchdogConfig,
)
from contract.config.remote import RemoteConfig
from contract.config.search import SearchConfig
from contract.config.training import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    StrategyConfig,
    TrainerConfig,
)

__all__ = [
    "Config", "SEED_MAX", "num", "path_key", "ModelConfig", "DataConfig", "OptimConfig", "StrategyConfig",
    "ParallelConfig", "PrecisionConfig", "TrainerConfig", "RunConfig", "CheckpointConfig", "LocalConfig",
    "LoggerConfig", "LauncherConfig", "TelemetryConfig", "WatchdogConfig", "ProfileConfig", "ClusterConfig",
    "EvalConfig", "StabilityConfig", "RemoteConfig", "SearchConfig",
    "ContainerConfig",
]


@dataclass
class Config:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    strategy: StrategyConfig = MISSING
    precision: PrecisionConfig = MISSING
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    # container=NAME: the image the ranks run in (contract/config/container.py); none by default.
    container: ContainerConfig = field(default_factory=ContainerConfig)
    cluster: ClusterConfig | None = None
    profile: ProfileConfig | None = None
    # +remote=NAME never reaches a composed config: the command runs on that login node (launcher/run/remote/).
    remote: RemoteConfig | None = None
