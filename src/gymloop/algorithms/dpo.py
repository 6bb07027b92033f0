"""Direct preference optimisation: a pair of completions of one prompt, the preferred and the
other, and the policy's log-ratio to a frozen reference on each.

    logp_chosen, logp_rejected          [B]  policy log-probs of each completion (summed over its
                                             tokens, or averaged with `length_normalize`)
    ref_chosen, ref_rejected            [B]  the same under the reference (ignored `reference_free`)
    nll_chosen                          [B]  the chosen completion's mean token NLL (for `sft_weight`)

loss = -log sigmoid(beta * ((logp_c - ref_c) - (logp_r - ref_r)))   (Rafailov et al. 2023)
     + sft_weight * nll_chosen                                        (RPO, Pang et al. 2024)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def sequence_logps(logp: torch.Tensor, mask: torch.Tensor, length_normalize: bool = False) -> torch.Tensor:
    """logp, mask [N, L] -> [N]: each completion's log-prob (sum of its tokens'), or their mean."""
    total = (logp * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if length_normalize else total


@dataclass(frozen=True)
class DPOLoss:
    """The DPO objective and the options hosted APIs offer: `length_normalize` (log-ratios per
    token, so long answers do not dominate), `reference_free` (no reference model: the policy's
    own log-probs), `sft_weight` (an NLL term on the preferred answer, as RPO)."""

    beta: float = 0.1
    length_normalize: bool = False
    reference_free: bool = False
    sft_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"dpo beta must be > 0, got {self.beta}")
        if self.sft_weight < 0:
            raise ValueError(f"dpo sft_weight must be >= 0, got {self.sft_weight}")

    def __call__(self, logp_chosen: torch.Tensor, logp_rejected: torch.Tensor,
                 ref_chosen: torch.Tensor | None, ref_rejected: torch.Tensor | None,
                 nll_chosen: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """All [B]; returns the batch-mean loss and float metrics."""
        if self.reference_free:
            chosen, rejected = logp_chosen, logp_rejected
        else:
            if ref_chosen is None or ref_rejected is None:
                raise ValueError("DPO with a reference needs the reference log-probs (or reference_free)")
            chosen, rejected = logp_chosen - ref_chosen, logp_rejected - ref_rejected
        margin = self.beta * (chosen - rejected)                         # [B]
        per_pair = -F.logsigmoid(margin)
        if self.sft_weight:
            if nll_chosen is None:
                raise ValueError("sft_weight needs the chosen completions' NLL")
            per_pair = per_pair + self.sft_weight * nll_chosen
        loss = per_pair.mean()
        with torch.no_grad():
            metrics = {"loss": loss.item(), "reward_margin": margin.mean().item(),
                       "reward_accuracy": (margin > 0).float().mean().item(),
                       "chosen_reward": (self.beta * chosen).mean().item(),
                       "rejected_reward": (self.beta * rejected).mean().item()}
        return loss, metrics
