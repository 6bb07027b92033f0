"""Advantage estimators: rewards of a group of samples of one prompt -> one advantage per
sample. A name -> function table; `advantages_for` applies one to scored rollouts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .table import Table

# rewards [G, g] (G groups of g samples) -> advantages [G, g]
Estimator = Callable[[torch.Tensor], torch.Tensor]


def grpo_advantages(r: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (std + eps) within each group: GRPO (Shao et al. 2024, DeepSeekMath),
    population std."""
    return (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True, unbiased=False) + eps)


def dr_grpo_advantages(r: torch.Tensor) -> torch.Tensor:
    """r - mean, no division by the std: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
    Training"); dividing by a small std inflates near-unanimous groups."""
    return r - r.mean(-1, keepdim=True)


def rloo_advantages(r: torch.Tensor) -> torch.Tensor:
    """r_i - mean of the *other* g - 1 rewards: RLOO (Kool et al. 2019; Ahmadian et al. 2024,
    "Back to Basics"). Equals g / (g - 1) * (r - mean): an unbiased baseline."""
    g = r.shape[-1]
    return (r * g - r.sum(-1, keepdim=True)) / (g - 1)


ADVANTAGES: Table[Estimator] = Table("advantage estimator", {
    "grpo": (grpo_advantages, "group-normalised: (r - mean) / std (GRPO)"),
    "dr_grpo": (dr_grpo_advantages, "r - mean, no std (Dr. GRPO)"),
    "rloo": (rloo_advantages, "r - mean of the other samples (RLOO, leave-one-out)"),
})


def group_advantages(rewards: torch.Tensor, group_size: int, name: str = "grpo") -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [N] with N = groups * group_size, consecutive members of a group adjacent.

    Returns advantages [N] and zero_signal [N // group_size] (bool), True for groups whose
    rewards are all equal: their advantages are exactly 0 and they carry no learning signal.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)                       # [G, g]
    zero = (r.max(-1).values - r.min(-1).values) == 0              # [G]
    adv = torch.where(zero[:, None], torch.zeros_like(r), ADVANTAGES.impl(name)(r))
    return adv.reshape(-1), zero


@dataclass
class Advantages:
    rollouts: list             # the rollouts kept for training
    advantages: torch.Tensor   # [len(rollouts)]
    groups: int                # groups considered (with >= 2 valid members)
    zero_signal_groups: int    # groups whose rewards were all equal
    sizes: list[int] = field(default_factory=list)   # members of each kept group, in order

    def first(self, n: int) -> "Advantages":
        """Only the first n kept groups (dynamic sampling trains on a fixed number)."""
        if n >= len(self.sizes):
            return self
        k = sum(self.sizes[:n])
        return Advantages(self.rollouts[:k], self.advantages[:k], self.groups, self.zero_signal_groups,
                          self.sizes[:n])

    @property
    def signal_groups(self) -> int:
        return self.groups - self.zero_signal_groups


def advantages_for(rollouts: Sequence, group_size: int, name: str = "grpo", drop_zero_signal: bool = True,
                   rewards: Sequence[float] | None = None) -> Advantages:
    """Advantages of scored rollouts (anything with `.ok` and `.reward`); groups are
    consecutive runs of `group_size`. `rewards` (one per rollout) replaces `.reward`, e.g.
    shaped ones.

    Rollouts with an infrastructure error are excluded before the estimator sees the group,
    so a crashed sandbox never counts as a failed attempt.
    """
    reward = [r.reward for r in rollouts] if rewards is None else list(rewards)
    kept, advs, sizes, groups, zero = [], [], [], 0, 0
    for start in range(0, len(rollouts), group_size):
        idx = [i for i in range(start, min(start + group_size, len(rollouts))) if rollouts[i].ok]
        if len(idx) < 2:
            continue
        groups += 1
        adv, z = group_advantages(torch.tensor([float(reward[i]) for i in idx]), len(idx), name)
        if bool(z[0]):
            zero += 1
            if drop_zero_signal:
                continue
        kept += [rollouts[i] for i in idx]
        advs.append(adv)
        sizes.append(len(idx))
    return Advantages(kept, torch.cat(advs) if advs else torch.zeros(0), groups, zero, sizes)
