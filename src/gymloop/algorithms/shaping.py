"""Reward shaping applied before advantages."""
from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward.

    lengths [N] generated tokens per episode; `max_len` the budget; `cache` the soft band:
    0 up to max_len - cache, then falling linearly to -1 at max_len, and -1 beyond it.
    Returns [N]. cache = 0 turns it off (all zeros).
    """
    if cache <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float)
    if cache > max_len:
        raise ValueError(f"overlong cache {cache} exceeds the length budget {max_len}")
    soft = max_len - cache
    x = lengths.float()
    return torch.where(x <= soft, torch.zeros_like(x),
                       torch.where(x <= max_len, (soft - x) / cache, -torch.ones_like(x)))
