"""GRPO: group-relative advantages and the clipped, token-level policy-gradient loss.

Departures from the original GRPO paper (Shao et al., 2024), each optional:
- `scale_std=False` drops the division by the group's reward std (Dr. GRPO, Liu et al. 2025):
  dividing by a small std inflates the weight of near-unanimous groups.
- The loss is aggregated per token over the whole batch (DAPO-style "token-mean") by default,
  so long completions are not down-weighted; "seq-mean" averages per sequence first.
- Clipping bounds may differ (`clip_low`, `clip_high`; DAPO's "clip-higher").
"""
from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean"]


def group_advantages(rewards: torch.Tensor, group_size: int, scale_std: bool = True,
                     eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [N] with N = groups * group_size, consecutive members of a group adjacent.

    Returns advantages [N] = r - mean(group) (divided by std(group) + eps when `scale_std`)
    and zero_signal [N // group_size] (bool), True for groups whose rewards are all equal:
    their advantages are exactly 0 and they carry no learning signal.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)                       # [G, g]
    mean = r.mean(-1, keepdim=True)                                # [G, 1]
    adv = r - mean                                                 # [G, g]
    std = r.std(-1, keepdim=True, unbiased=False)                  # [G, 1] population std
    zero = (r.max(-1).values - r.min(-1).values) == 0              # [G]
    if scale_std:
        adv = adv / (std + eps)
    adv = torch.where(zero[:, None], torch.zeros_like(adv), adv)
    return adv.reshape(-1), zero


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              loss_mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
              ref_logp: torch.Tensor | None = None, beta: float = 0.0,
              agg: LossAgg = "token-mean", normalizer: float | None = None) -> tuple[torch.Tensor, dict]:
    """Clipped policy-gradient loss.

    logp, old_logp, loss_mask: [N, L]  (current / behaviour log-probs; 1 on trained tokens)
    advantages: [N]                   (one per sequence, broadcast over its tokens)
    ref_logp: [N, L] or None          (frozen reference; adds beta * KL, k3 estimator)
    normalizer: the token count ("token-mean") or sequence count ("seq-mean") to divide by;
        None means this batch's own. Data-parallel ranks pass the *global* count, so the sum
        of their gradients equals the gradient of the whole batch on one process.
    Returns the scalar loss and float metrics.
    """
    mask = loss_mask.float()
    log_ratio = (logp - old_logp) * mask                          # [N, L]
    ratio = log_ratio.exp()
    adv = advantages[:, None].float()                              # [N, 1]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    per_tok = -torch.minimum(unclipped, clipped)                   # [N, L]
    kl = torch.zeros_like(per_tok)
    if ref_logp is not None and beta > 0:
        d = ref_logp - logp                                        # k3: e^d - d - 1 >= 0
        kl = d.exp() - d - 1
        per_tok = per_tok + beta * kl
    loss = _aggregate(per_tok, mask, agg, normalizer)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        is_clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        metrics = {
            "loss": loss.item(),
            "clip_frac": ((is_clipped.float() * mask).sum() / n).item(),
            "approx_kl_behaviour": ((0.5 * log_ratio**2) * mask).sum().div(n).item(),
            "kl_ref": ((kl * mask).sum() / n).item(),
            "ratio_max": (ratio * mask).max().item(),
        }
    return loss, metrics


def _aggregate(per_tok: torch.Tensor, mask: torch.Tensor, agg: LossAgg,
               normalizer: float | None = None) -> torch.Tensor:
    if agg == "token-mean":
        return (per_tok * mask).sum() / (normalizer or mask.sum().clamp(min=1))
    if agg == "seq-mean":
        per_seq = (per_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        # sequences with no trained token (padding rows) do not count
        return per_seq.sum() / (normalizer or (mask.sum(-1) > 0).sum().clamp(min=1))
    raise ValueError(f"unknown loss aggregation {agg!r}; known: token-mean, seq-mean")
