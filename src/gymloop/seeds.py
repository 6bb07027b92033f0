"""Every seed a run derives from its configured one, in one place: a resumed run, a loop round's
curriculum and a fine-tuning job draw the same numbers as the code that first drew them.

    step_seed(seed, step)       a training step's task sample and sampling seed
    round_seed(seed, round)     a loop round's run seed (its steps: step_seed(round_seed, step))
    epoch_order(seed, epoch, n) the order of n examples in a fine-tuning job's epoch
"""
from __future__ import annotations

import torch


def step_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


def round_seed(seed: int, round: int) -> int:
    return seed * 1000 + round


def epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    """[n] a permutation of range(n), the same for the same (seed, epoch)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
