"""The on-device verdict on one optimizer step, taken before the update and never read by the host at once.

The decision uses only values every rank shares, so that every replica skips the same steps: the global gradient
norm (after DDP's all-reduce, FSDP's reduce-scatter or the pipeline's reduction: a NaN in one rank's loss reaches
every rank's norm) and, with the spike rule, the loss averaged over the ranks (one all-reduce on the device, only
then). The result is a float tensor, 1.0 to skip: fused AdamW takes it as `found_inf` (what torch's GradScaler
passes) and leaves parameters, moments and its step count untouched, on the device.

With fp16 the loss scaler skips every overflowing step itself and halves its scale: routine early in a run, so such a
step's code is SCALER alone. An overflow with the scale already at MIN_SCALE or below (where DeepSpeed's and
Megatron's scalers stop lowering it: 1.0) is no longer the scaler's business but a non-finite step (NONFINITE too):
stability.nonfinite decides what follows, as in bf16 or fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

NONFINITE, SPIKE, SCALER = 1, 2, 4  # bits of a step's code
# The fp16 loss scale at or below which an overflow is a non-finite step, not a routine skip of the scaler's.
MIN_SCALE = 1.0


class SpikeRule:
    """OLMo-core's rule: skip when the loss or the gradient norm is more than `sigma` standard deviations above the
    mean of the last `window` steps' values, once half the window holds values. Unlike OLMo-core the window keeps
    only the steps that were applied: one spike would otherwise widen the spread enough to let the next through. A
    lasting shift is not learned as normal then: it is a run of skipped steps, which rolls back after
    stability.skip_limit (and the window starts afresh). A ring buffer on the device; the host only counts calls."""

    def __init__(self, sigma: float, window: int, device: torch.device) -> None:
        self.sigma, self.window = float(sigma), int(window)
        self.min_count = float(max(2, self.window // 2))
        # Values and a weight per slot (1.0: an applied step's values, 0.0: empty): float math only, no casts.
        self.values = torch.zeros((self.window, 2), device=device)
        self.weights = torch.zeros(self.window, device=device)
        self.calls = 0

    def reset(self) -> None:
        self.values.zero_()
        self.weights.zero_()
        self.calls = 0

    def state_dict(self) -> dict[str, Any]:
        """The window as it stands (host copies: a save's one read of the device), for the checkpoint."""
        return {"values": self.values.cpu(), "weights": self.weights.cpu(), "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """The window of a checkpoint; returns a note where it could not be taken as it was (None: exactly)."""
        values, weights, calls = state["values"], state["weights"], int(state["calls"])
        self.reset()
        if values.shape == self.values.shape:  # the same ring, slot for slot: the sums are bitwise the same
            self.values.copy_(values)
            self.weights.copy_(weights)
            self.calls = calls
            return None
        # Another stability.spike_window: the newest values, oldest first, into a fresh ring.
        saved = values.shape[0]
        order = [(calls + i) % saved for i in range(saved)] if calls >= saved else list(range(calls))
        kept = [i for i in order if float(weights[i]) > 0][-self.window:]
        for slot, i in enumerate(kept):
            self.values[slot] = values[i]
            self.weights[slot] = 1.0
        self.calls = len(kept)
        return (f"the spike rule's window was saved with {saved} slots and is {self.window} now: kept its newest "
                f"{len(kept)} values")

    def __call__(self, values: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
        """`values`: [loss, grad norm]; `bad`: true where they are not finite. Returns a bool tensor, true for a
        spike (never for a bad step, which is not stored either)."""
        w, h = self.weights, self.values
        count = w.sum()
        mean = (w @ h) / count.clamp(min=1.0)
        var = (w @ (h - mean).square()) / (count - 1.0).clamp(min=1.0)
        spike = ((values - mean) > self.sigma * var.sqrt()).any() & (count >= self.min_count) & ~bad
        keep = ~(spike | bad)
        slot = self.calls % self.window
        h[slot] = torch.where(keep, values, 0.0)
        w[slot] = keep
        self.calls += 1
        return spike


class StepVerdict:
    """Per step: the skip flag for the optimizer, and the step's code (NONFINITE | SPIKE bits) for the host."""

    def __init__(self, spike: SpikeRule | None, world_size: int, device: torch.device, fp16: bool = False,
                 scaler: Any = None) -> None:
        self.spike, self.world_size, self.device = spike, world_size, device
        # With fp16 the loss scaler skips non-finite steps itself (and lowers the scale): they are its business,
        # routine early in a run, until its scale has collapsed (MIN_SCALE). `scaler`: torch's GradScaler, whose
        # scale (a device tensor, made at the first backward) is read on the device, never by the host.
        self.fp16, self.scaler = fp16 or scaler is not None, scaler

    def share(self, loss: torch.Tensor) -> SharedLoss | None:
        """With the spike rule: start averaging the step's loss over the ranks as soon as it is known, so that the
        all-reduce runs while the strategy computes the gradient norm (on gloo it cost a 2-rank tiny step 3 ms
        when it waited for the verdict)."""
        return SharedLoss(loss.detach().float(), self.world_size) if self.spike is not None else None

    def __call__(self, loss: torch.Tensor | SharedLoss, norm: torch.Tensor) -> torch.Tensor:
        """The step's code as a float tensor (0: apply the update; NONFINITE and SPIKE bits otherwise)."""
        norm = torch.as_tensor(norm, device=self.device)
        if self.spike is None:
            if self.fp16:
                return self._scaler_code(norm)
            return torch.isfinite(norm).logical_not_().float()
        shared = (loss if isinstance(loss, SharedLoss) else SharedLoss(loss.detach().float(), self.world_size)).value()
        values = torch.stack([shared, norm.float()])
        bad = ~torch.isfinite(values).all()
        spike = self.spike(values, bad)
        if self.fp16:  # never reached: the spike rule is refused with fp16 (contract/rules/stability_checks.py)
            return spike.float() * SPIKE
        return bad.float() + spike.float() * SPIKE


    def _scaler_code(self, norm: torch.Tensor) -> torch.Tensor:
        """fp16: SCALER where the scaler skips the step (a gradient overflowed: the norm is not finite), NONFINITE
        as well where its scale had already collapsed to MIN_SCALE or below."""
        overflow = torch.isfinite(norm).logical_not_()
        scale = getattr(self.scaler, "_scale", None)
        if scale is None:  # no scaler object (unit tests), or none made yet: nothing collapsed
            return overflow * float(SCALER)
        return overflow * (scale.reshape(()) <= MIN_SCALE).add(float(SCALER))  # NONFINITE is 1: collapsed + SCALER


class SharedLoss:
    """The mean of a value over all ranks, the all-reduce started at once and waited for at `value()` (on NCCL the
    wait orders the streams: no host sync)."""

    def __init__(self, value: torch.Tensor, world_size: int) -> None:
        self.world_size, self.work = world_size, None
        self.sum = value.clone()
        if world_size > 1 and dist.is_initialized():
            self.work = dist.all_reduce(self.sum, async_op=True)

    def value(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
            self.work = None
            self.sum /= self.world_size
        return self.sum


def skip_flag(code: torch.Tensor) -> torch.Tensor:
    """The optimizer's found_inf: 1.0 where the step must not be applied."""
    return (code != 0).float()


def apply_with_skip(optimizer: Any, skip: torch.Tensor) -> None:
    """optimizer.step(), a no-op on the device where `skip` is 1.0 (fused AdamW's found_inf path)."""
    optimizer.grad_scale, optimizer.found_inf = None, skip
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf
