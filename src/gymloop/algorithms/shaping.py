"""Reward shaping applied before advantages."""
from __future__ import annotations

from typing import Mapping, Sequence

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


def weighted_components(components: Sequence[Mapping[str, float] | None], weights: Mapping[str, float]) -> list[float]:
    """One reward per episode: sum_k weights[k] * components[k] of its verdict (TRL's reward_weights
    over reward functions; here the functions are a verifier's components). None (an episode
    whose infrastructure failed, left out of training anyway) gives 0. A weight naming a
    component the verifier does not report is an error, not a silent 0."""
    out = []
    for c in components:
        if c is None:
            out.append(0.0)
            continue
        missing = sorted(set(weights) - set(c))
        if missing:
            raise ValueError(f"reward_weights name {missing}, which the verifier does not report "
                             f"(its components: {sorted(c)})")
        out.append(sum(w * float(c[k]) for k, w in weights.items()))
    return out
