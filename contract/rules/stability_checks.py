"""Launch-time refusals for the stability section and optim.z_loss (torch-free: the launcher imports it)."""

from __future__ import annotations

from typing import Any

from contract.errors import ConfigError, shown


def check_stability(cfg: Any) -> None:
    """What a strategy can't honour is refused before anything runs, in one line that names the fix."""
    s = cfg.get("stability")
    if s is None:
        return
    if not s.enabled:
        from contract.config.schema import StabilityConfig

        for key, value in s.items():
            if key != "enabled" and value != getattr(StabilityConfig, key, value):
                raise ConfigError(f"stability.{key}={shown(value)} has no effect with stability.enabled=false (no checks run): "
                                  f"drop it, or set stability.enabled=true")
    deepspeed = cfg.strategy.get("backend") == "deepspeed"
    if s.enabled and float(s.spike_sigma) > 0:
        if deepspeed:
            raise ConfigError(f"stability.spike_sigma={shown(s.spike_sigma)} with strategy={cfg.strategy.name}: DeepSpeed's "
                              "engine applies its own update, which a spike can't stop; use strategy=fsdp (ZeRO-3 "
                              "layout) or set stability.spike_sigma=0")
        if cfg.precision.compute_dtype == "float16":
            raise ConfigError(f"stability.spike_sigma={shown(s.spike_sigma)} with precision=fp16: the loss scaler decides "
                              "which fp16 steps are applied; use precision=bf16 or set stability.spike_sigma=0")
    if float(cfg.optim.get("z_loss", 0.0)) > 0 and int(cfg.parallel.pp) > 1:
        raise ConfigError(f"optim.z_loss={shown(cfg.optim.z_loss)} with parallel.pp={cfg.parallel.pp}: the pipeline "
                          "schedule computes its own loss; set optim.z_loss=0 or train with parallel.pp=1")


def plan_note(cfg: Any) -> str | None:
    """A line for the launch plan where the policy acts differently than it reads (None: as it reads)."""
    s = cfg.get("stability")
    if s is None or not s.enabled:
        return None
    if cfg.strategy.get("backend") == "deepspeed" and s.nonfinite == "skip":
        return (f"stability: strategy={cfg.strategy.name} applies its own update, so a non-finite step is rolled back "
                "rather than skipped (stability.nonfinite=skip acts as rollback)")
    return None
