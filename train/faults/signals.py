"""The stop flag: signal handlers that only record which signal arrived. Stdlib only, so that entry.py can
install it before importing torch: a preemption signal that lands during start-up or a long checkpoint load must
not kill the rank (the default action of SIGUSR1 and SIGTERM)."""

from __future__ import annotations

import signal
from types import FrameType


def preempt_signal(cfg: object) -> str:
    """The cluster's preemption signal; local runs (and sbatch/ scripts without +cluster) use USR1."""
    cluster = getattr(cfg, "cluster", None)
    return str(cluster.signal) if cluster is not None else "USR1"


def signal_number(name: str) -> int:
    name = name.upper()
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


class StopFlag:
    """SLURM's preemption signal (cluster.signal, USR1 by default) asks for checkpoint + requeue. SIGTERM, which
    SLURM sends on GraceTime preemption, on scancel and at the very end, asks for a checkpoint and no requeue
    (SLURM requeues a preempted job itself when PreemptMode=REQUEUE)."""

    def __init__(self, preempt_signal: str = "USR1") -> None:
        self.preempt = signal_number(preempt_signal)
        self.received: int | None = None
        for sig in {self.preempt, signal.SIGTERM}:
            signal.signal(sig, self._on_signal)
        # The local launcher starts workers with these blocked; a signal that arrived meanwhile is delivered now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {self.preempt, signal.SIGTERM})

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Nothing else here: saving inside a handler would race the training step and the other ranks.
        if self.received != self.preempt:  # a requeue request is never downgraded by a later SIGTERM
            self.received = signum

    @property
    def wants_requeue(self) -> bool:
        return self.received == self.preempt

    def close(self) -> None:
        # Ignore, don't restore the default: a late signal during shutdown must not turn a clean exit into a kill.
        for sig in {self.preempt, signal.SIGTERM}:
            signal.signal(sig, signal.SIG_IGN)
