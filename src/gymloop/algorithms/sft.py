"""Supervised fine-tuning: mean negative log-likelihood of the masked tokens."""
from __future__ import annotations

import torch


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """logp, loss_mask: [N, L]. Token-mean NLL over the masked tokens."""
    n = loss_mask.sum().clamp(min=1)
    loss = -(logp * loss_mask).sum() / n
    return loss, {"nll": loss.item(), "tokens": int(loss_mask.sum().item())}
