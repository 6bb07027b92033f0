"""Policy-gradient losses: a name -> per-token-loss table, and `PolicyLoss`, the one place a
loss is combined with an off-policy correction, a KL penalty and an aggregation.

Every loss takes
    logp      [N, L]  the trained policy's log-probs of the sampled tokens (with grad)
    old_logp  [N, L]  what the ratio is taken against: the behaviour log-probs, or with a
                      correction the trainer's before the step less the corrected log weight
                      (no grad)
    adv       [N]     one advantage per sequence
    mask      [N, L]  1.0 on trained tokens
and returns (per_tok [N, L], clipped [N, L] bool): the loss of every token before masking and
aggregation, and where the clip removed the gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .aggregation import AGGREGATIONS, aggregate
from .corrections import CORRECTIONS
from .table import Table

PerTokenLoss = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def clipped_token_loss(logp, old_logp, adv, mask, *, clip_low: float, clip_high: float):
    """PPO's clipped surrogate per token (Schulman et al. 2017) as GRPO uses it (Shao et al.
    2024), with separate bounds: clip_high > clip_low is DAPO's clip-higher (Yu et al. 2025)."""
    ratio = ((logp - old_logp) * mask).exp()                                    # [N, L]
    a = adv[:, None]
    per_tok = -torch.minimum(ratio * a, ratio.clamp(1 - clip_low, 1 + clip_high) * a)
    clipped = ((ratio < 1 - clip_low) & (a < 0)) | ((ratio > 1 + clip_high) & (a > 0))
    return per_tok, clipped


def gspo_loss(logp, old_logp, adv, mask, *, clip_low: float, clip_high: float):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one ratio per sequence,
    the geometric mean of its token ratios s_i = exp(mean_t(logp - old_logp)), clipped per
    sequence. Written in the paper's GSPO-token form, s_it = sg(s_i) * pi_t / sg(pi_t): each token
    carries s_i's value and the gradient of its own log-prob, which is GSPO's gradient; aggregate
    with seq-mean for the paper's objective. Its clip ranges are ~1e-3, not 0.2 (the paper uses
    3e-4 / 4e-4)."""
    m = mask.float()
    seq_log_ratio = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1)    # [N]
    s = seq_log_ratio.detach().exp()[:, None]                                   # [N, 1] sg(s_i)
    s_tok = s * (logp - logp.detach()).exp()                                    # [N, L] value s_i
    a = adv[:, None]
    per_tok = -torch.minimum(s_tok * a, s_tok.clamp(1 - clip_low, 1 + clip_high) * a)
    clipped = (((s < 1 - clip_low) & (a < 0)) | ((s > 1 + clip_high) & (a > 0))).expand_as(per_tok)
    return per_tok, clipped


def cispo_loss(logp, old_logp, adv, mask, *, clip_low: float, clip_high: float):
    """CISPO (MiniMax-M1, 2025): REINFORCE with the importance weight clipped and detached,
    -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A * logp_t. Unlike PPO's clip it never drops a
    token's gradient, it bounds its weight (MiniMax sets no lower bound: clip_low near 1)."""
    ratio = ((logp - old_logp) * mask).exp()
    w = ratio.detach().clamp(1 - clip_low, 1 + clip_high)
    per_tok = -w * adv[:, None] * logp
    clipped = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
    return per_tok, clipped


LOSSES: Table[PerTokenLoss] = Table("loss", {
    "grpo": (clipped_token_loss, "token-level clipped ratio (GRPO; DAPO with clip_high > clip_low)"),
    "gspo": (gspo_loss, "sequence-level ratio, clipped per sequence (GSPO)"),
    "cispo": (cispo_loss, "REINFORCE with a clipped, detached importance weight (CISPO)"),
})


def kl_k3(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate, k3 = e^d - d - 1 >= 0 with d = ref - logp (Schulman)."""
    d = ref_logp - logp
    return d.exp() - d - 1


@dataclass(frozen=True)
class PolicyLoss:
    """A loss as the trainer calls it: name, clip bounds, KL weight, aggregation and the
    off-policy correction (`corrections.py`). `needs_ref` and `needs_proximal` (the trainer's
    log-probs before the step, for a correction) tell the trainer which extra forward passes to
    run."""

    name: str = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.28
    beta: float = 0.0
    agg: str = "token-mean"
    correction: str = "none"
    correction_low: float = 0.5
    correction_high: float = 2.0

    def __post_init__(self) -> None:
        # unknown names fail at construction
        LOSSES.impl(self.name), CORRECTIONS.impl(self.correction), AGGREGATIONS.impl(self.agg)

    @property
    def needs_ref(self) -> bool:
        return self.beta > 0

    @property
    def needs_proximal(self) -> bool:
        return self.correction != "none"

    def __call__(self, logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                 loss_mask: torch.Tensor, *, proximal_logp: torch.Tensor | None = None,
                 ref_logp: torch.Tensor | None = None,
                 normalizer: float | None = None) -> tuple[torch.Tensor, dict]:
        """logp, behaviour_logp, loss_mask: [N, L]; advantages: [N]; proximal_logp, ref_logp:
        [N, L] or None. `normalizer`: the global count of `agg` across data-parallel ranks.
        Returns the scalar loss and float metrics."""
        mask = loss_mask.float()
        # divided by the count of *trained* tokens (or sequences) before any is masked: the same
        # count data-parallel ranks sum (trainer._global_count), and a masked token then weighs
        # 0 instead of raising the weight of the kept ones
        if normalizer is None:
            normalizer = float(AGGREGATIONS.impl(self.agg).count(mask).clamp(min=1))
        old = behaviour_logp
        cmetrics: dict[str, float] = {}
        if self.needs_proximal:
            if proximal_logp is None:
                raise ValueError(f"correction {self.correction!r} needs the trainer's log-probs before the step")
            # ratio = (pi_theta / pi_trainer) * w with w the corrected trainer/behaviour weight:
            # the same as against the behaviour log-probs wherever the correction leaves k alone
            log_w, keep, cmetrics = CORRECTIONS.impl(self.correction)(
                proximal_logp, behaviour_logp, mask, low=self.correction_low, high=self.correction_high)
            mask = mask * keep
            old = proximal_logp - log_w
        adv = advantages.float()
        per_tok, clipped = LOSSES.impl(self.name)(logp, old, adv, mask, clip_low=self.clip_low,
                                              clip_high=self.clip_high)
        kl = kl_k3(ref_logp, logp) if ref_logp is not None and self.beta > 0 else torch.zeros_like(per_tok)
        per_tok = per_tok + self.beta * kl
        loss = aggregate(per_tok, mask, self.agg, normalizer)
        with torch.no_grad():
            n = mask.sum().clamp(min=1)
            log_ratio = (logp - old) * mask
            metrics = {
                "loss": loss.item(),
                "clip_frac": ((clipped.float() * mask).sum() / n).item(),
                "approx_kl_behaviour": ((0.5 * log_ratio ** 2) * mask).sum().div(n).item(),
                "kl_ref": ((kl * mask).sum() / n).item(),
                "ratio_max": (log_ratio.exp() * mask).max().item(),
                **cmetrics,
            }
        return loss, metrics
