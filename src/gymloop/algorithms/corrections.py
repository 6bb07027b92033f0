"""Off-policy corrections for the trainer/behaviour mismatch: a rollout was sampled by an
engine (other kernels; in asynchronous runs, weights some versions old) whose token
probabilities are not the trainer's. With k = pi_trainer / pi_behaviour on each sampled token
(the trainer's weights before this step against the engine's recorded log-probs), a correction
maps

    proximal_logp   [N, L]  the trainer's log-probs before this step (no grad)
    behaviour_logp  [N, L]  the engine's log-probs, recorded at sampling
    mask            [N, L]  1.0 on trained tokens

to (log_w [N, L], keep [N, L], metrics): the log of the importance weight that replaces log k in
the loss's ratio, pi_theta / pi_behaviour = (pi_theta / pi_trainer) * k, and the tokens kept.
The ratio stays inside the loss's clip (its trust region), so a correction changes a token only
where the mismatch is extreme, and with no mismatch (k = 1) it changes nothing. `mismatch_kl`
and `masked_frac` are logged every step.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .table import Table

Correction = Callable[..., tuple[torch.Tensor, torch.Tensor, dict]]


def _log_k_and_metrics(proximal_logp, behaviour_logp, mask, keep):
    log_k = (proximal_logp - behaviour_logp) * mask
    k = log_k.exp()
    n = mask.sum().clamp(min=1)
    metrics = {
        # KL(behaviour || trainer) on the sampled tokens, k3 estimator: k - 1 - log k >= 0
        "mismatch_kl": (((k - 1 - log_k) * mask).sum() / n).item(),
        "masked_frac": (((1 - keep) * mask).sum() / n).item(),
    }
    return log_k, metrics


def no_correction(proximal_logp, behaviour_logp, mask, *, low: float, high: float):
    """k as it is (the plain ratio against the behaviour log-probs); the mismatch is measured."""
    keep = torch.ones_like(mask)
    log_k, metrics = _log_k_and_metrics(proximal_logp, behaviour_logp, mask, keep)
    return log_k, keep, metrics


def tis(proximal_logp, behaviour_logp, mask, *, low: float, high: float):
    """Truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training"): the weight is min(k, high); every token kept."""
    keep = torch.ones_like(mask)
    log_k, metrics = _log_k_and_metrics(proximal_logp, behaviour_logp, mask, keep)
    return log_k.clamp(max=math.log(high)), keep, metrics


def icepop(proximal_logp, behaviour_logp, mask, *, low: float, high: float):
    """IcePop (Ling team, Ring-1T 2025) / masked importance sampling (Liu et al. 2025, "When
    Speed Kills Stability"): tokens whose k is outside [low, high] are masked out of the loss
    (their gradient is the mismatch's noise, not signal); the others keep k."""
    log_k = (proximal_logp - behaviour_logp) * mask
    k = log_k.exp()
    keep = ((k >= low) & (k <= high)).float()
    _, metrics = _log_k_and_metrics(proximal_logp, behaviour_logp, mask, keep)
    return log_k, keep, metrics


CORRECTIONS: Table[Correction] = Table("correction", {
    "none": (no_correction, "no correction: the ratio is against the behaviour log-probs"),
    "tis": (tis, "truncated importance sampling: the trainer/behaviour weight capped at `high`"),
    "icepop": (icepop, "mask tokens whose pi_trainer / pi_behaviour is outside [low, high] (IcePop / MIS)"),
})
