"""DiLoCo across replica groups (optim.outer=diloco; docs/faults.md): each group steps the configured (inner) optimizer
alone, and every optim.sync_every steps the groups average their pseudo-gradients (the last global weights less
their own) and apply them to the global weights with SGD (outer_lr, outer_momentum, Nesterov: the DiLoCo paper's
0.7 / 0.9 / on, as torchft and OLMo-core default). Every group's weights are then the new global ones.

torchft's own torchft.local_sgd.DiLoCo is not used: it all-reduces one tensor per parameter (or in buckets behind an
environment switch), its sync runs from the inner optimizer's step hook (a step that GradScaler skips would put a
group's syncs out of step with the others'), and it has no room for the slots our average carries (who took part,
the stop). This is the same outer step over CrossGroupAverage (averaging.py): one all-reduce a dtype per sync, on
the same counter as the per-step average. Its failure semantics are torchft's: a sync whose commit vote fails (a
group lost during its all-reduce) is discarded, every group's weights go back to the last global ones, and the
interval's steps are not trained (events.jsonl names their samples); a group lost between syncs is simply absent
from the next sync, which averages the groups present.

The global weights and the outer momentum are tensors like the parameters (an FSDP2 shard's DTensor, a DDP replica's
whole tensor), so that they go into the DCP checkpoint beside the model (`state_dict`, a Stateful) and to a healing
group with the rest of the held state (`held`, `load_held`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class OuterStep(Stateful):
    def __init__(self, optim: Any, model: torch.nn.Module) -> None:
        self.every = int(optim.sync_every)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        with torch.no_grad():
            self.globals = [p.detach().clone().requires_grad_(True) for p in self.params]
        self.outer = torch.optim.SGD(self.globals, lr=float(optim.outer_lr), momentum=float(optim.outer_momentum),
                                     nesterov=bool(optim.outer_nesterov) and float(optim.outer_momentum) > 0)
        # Made now, not at the first outer step, so that a checkpoint always has them to load into; SGD's first step
        # on a zero buffer (dampening 0) is its clone of the gradient, bit for bit.
        for g in self.globals:
            self.outer.state[g]["momentum_buffer"] = torch.zeros_like(g)
        self.syncs = 0  # committed syncs: the torchft Manager's step under DiLoCo

    def due(self, step: int) -> bool:
        """Whether step `step` (1-based, the one being finished) ends an interval."""
        return step % self.every == 0

    def pseudo_gradients(self) -> list[torch.Tensor]:
        """Each global weight's .grad set to the global weight less this group's: what the groups average."""
        with torch.no_grad():
            for g, p in zip(self.globals, self.params, strict=True):
                g.grad = g.detach() - p.detach()
        return self.globals

    def apply(self, committed: bool) -> None:
        """After the average: committed, the outer step on the averaged pseudo-gradients; either way the parameters
        become the global weights (discarded: the last ones, and the interval's inner steps are dropped)."""
        with torch.no_grad():
            if committed:
                self.outer.step()
                self.syncs += 1
            for g, p in zip(self.globals, self.params, strict=True):
                p.copy_(g)
        self.outer.zero_grad(set_to_none=True)

    def _momenta(self) -> list[torch.Tensor]:
        return [self.outer.state[g]["momentum_buffer"] for g in self.globals]

    # -- the DCP checkpoint (train/checkpoints/manager.py saves and loads it beside the model) ---------------------
    def state_dict(self) -> dict[str, Any]:
        sd: dict[str, Any] = {f"global.{n}": g.detach() for n, g in zip(self.names, self.globals, strict=True)}
        sd.update({f"momentum.{n}": m for n, m in zip(self.names, self._momenta(), strict=True)})
        sd["syncs"] = torch.tensor(self.syncs, dtype=torch.int64)
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        with torch.no_grad():
            for n, g, m in zip(self.names, self.globals, self._momenta(), strict=True):
                for own, saved in ((g, state_dict[f"global.{n}"]), (m, state_dict[f"momentum.{n}"])):
                    if saved is not own:  # DCP loads into the template's tensors in place
                        own.copy_(saved)
        self.syncs = int(state_dict["syncs"])

    # -- a healing group's share of the held state (manager.py held_state) -----------------------------------------
    def held(self) -> dict[str, Any]:
        return {"globals": [_local(g).detach() for g in self.globals],
                "momenta": [_local(m) for m in self._momenta()], "syncs": self.syncs}

    def load_held(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for own, saved in zip([*self.globals, *self._momenta()], [*state["globals"], *state["momenta"]],
                                  strict=True):
                _local(own).copy_(saved)
        self.syncs = int(state["syncs"])
