"""This project's own training script (plain PyTorch, one process), as most projects have one.

slurmtrain does not use it; it is here because a `train.py` in the working directory used to shadow slurmtrain's
`train` package. `python train.py` still works on its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from data import CharDataset
from model import ConvLM


def main(steps: int = 20) -> None:
    torch.manual_seed(0)
    data = CharDataset(seq_len=64)
    model = ConvLM(vocab_size=128)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        batch = torch.stack([data[(step * 8 + i) % len(data)] for i in range(8)])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step + 1} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
