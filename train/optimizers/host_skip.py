"""Optimizers whose update has no device path for the stability verdict's skip: the verdict is read on the host
(one synchronisation a step) and a skipped step is left out whole.

    SGD    torch's SGD over DTensors (FSDP, tensor parallelism), where its fused kernel, which takes the verdict on
           the device, has no sharding rule: foreach kernels then, which refuse it
    Lion   lion-pytorch's Lion (the reference PyTorch port of Chen et al. 2023), which knows nothing of it
"""

from __future__ import annotations

from typing import Any

import lion_pytorch
import torch

from train.optimizers.sharded import skipped_on_host


class SkipOnHost:
    def step(self, closure: Any = None) -> Any:
        if skipped_on_host(self):
            return None
        self.found_inf = None  # type: ignore[attr-defined]  # applied: torch's foreach kernels refuse the flag
        return super().step(closure)  # type: ignore[misc]


class SGD(SkipOnHost, torch.optim.SGD):
    def step(self, closure: Any = None) -> Any:
        if self.defaults.get("fused"):  # the fused kernel takes the verdict on the device
            return torch.optim.SGD.step(self, closure)
        return super().step(closure)


class Lion(SkipOnHost, lion_pytorch.Lion):
    pass
