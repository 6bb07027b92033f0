"""Supervised fine-tuning: mean negative log-likelihood of the masked tokens."""
from __future__ import annotations

import torch


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor,
             normalizer: float | None = None) -> tuple[torch.Tensor, dict]:
    """logp, loss_mask: [N, L]. The NLL summed over the masked tokens, over `normalizer` (None:
    their count, the token mean). A micro-batch is given its whole batch's count, so the summed
    gradients of the parts are the whole batch's; its `nll` metric is its own token mean."""
    n = loss_mask.sum().clamp(min=1)
    total = -(logp * loss_mask).sum()
    loss = total / (n if normalizer is None else normalizer)
    return loss, {"nll": (total / n).item(), "tokens": int(loss_mask.sum().item())}
