"""User-facing configuration errors: one line that names the fix, exit code 2."""

from __future__ import annotations

EXIT_BAD_INPUT = 2
# A worker that checkpointed and stopped without being requeued (local mode): the same command resumes.
EXIT_STOPPED = 75
# A run that stability.nonfinite=stop (or its last allowed rollback) ended: never requeued, the cause needs a person.
EXIT_DIVERGED = 76
# Local workers stopped at once by a second Ctrl-C, without a checkpoint (an end recorded as `killed`): 128 + SIGINT,
# as a shell reports a command that Ctrl-C ended.
EXIT_KILLED = 130


def shown(value: object) -> str:
    """A config value as an error quotes it: a float key given a whole number reads as the number typed
    (trainer.max_tokens=5000, not the 5000.0 a float-typed schema key turns it into), a boolean as an override
    writes it (data.shuffle=false, not False), anything else as str()."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class ConfigError(Exception):
    """Raised before anything is created, submitted or overwritten."""


class SweepExit(SystemExit):
    """A sweep's own exit code (bad input, a failed point), as opposed to Hydra's exit on a bad override."""
