"""What the trainer minimises: one objective per kind of training, each called per minibatch.

    objective.prepare(model, ref, batch)        extra no-grad passes before the first update
    objective(model, minibatch, rows) -> (loss, metrics, router aux loss or None)

`rows` are the minibatch's rows in the whole batch (per-row inputs such as advantages follow
them). The losses themselves are pure functions of `algorithms/`.

    PolicyObjective   GRPO and its variants: a PolicyLoss of advantages      algorithms/losses.py
    TokenNLL          SFT: NLL of the trained tokens                          algorithms/sft.py
    Preference        DPO: chosen rows, then as many rejected rows            algorithms/dpo.py
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..algorithms.aggregation import AGGREGATIONS
from ..algorithms.dpo import DPOLoss, sequence_logps
from ..algorithms.losses import PolicyLoss
from ..algorithms.sft import sft_loss
from .logprobs import CompletionLogprobs, TokenBatch, logprobs_and_aux, scorer_of

Step = tuple[torch.Tensor, dict, "torch.Tensor | None"]


class Objective(Protocol):
    def prepare(self, model: torch.nn.Module, ref: torch.nn.Module | None, batch: TokenBatch) -> None: ...

    def __call__(self, model: torch.nn.Module, mb: TokenBatch, rows: torch.Tensor) -> Step: ...


def distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _global_count(mb: TokenBatch, agg: str) -> float | None:
    """Data parallel: the whole batch's token (or sequence) count across ranks; None alone.
    Sequences count when they have a trained token (as in the loss), so a rank's padding
    rows (see cluster.ray_trainer) change nothing."""
    if not distributed():
        return None
    n = AGGREGATIONS.impl(agg).count(mb.loss_mask.float()).detach().clone().float()
    torch.distributed.all_reduce(n)
    return float(n.clamp(min=1))


@dataclass
class PolicyObjective:
    """GRPO's policy loss on scored rollouts. advantages: [N], one per row of the batch.

    The ratio is taken against log-probs fixed before the first update (the behaviour
    log-probs stored in the batch, or the proximal policy's when the loss corrects the
    behaviour mismatch), so later passes over the batch stay correct. Log-probs are those of
    the trained tokens only (completion_logps): a group's shared prompt runs once for its
    samples, and only the positions that predict a sampled token reach the vocabulary."""

    loss: PolicyLoss
    advantages: torch.Tensor
    temperature: float = 1.0
    ref_logp: torch.Tensor | None = None
    prox_logp: torch.Tensor | None = None

    @torch.no_grad()
    def prepare(self, model, ref, batch: TokenBatch) -> None:
        if self.loss.needs_ref and ref is None:
            raise ValueError("the loss has a KL term (beta > 0) but the trainer was built without a reference model")
        self.advantages = self.advantages.to(batch.input_ids.device)
        self.ref_logp = self._logp(ref, batch)[0] if self.loss.needs_ref else None
        # the trainer's own weights before this step: the decoupled-PPO proximal policy
        self.prox_logp = self._logp(model, batch)[0] if self.loss.needs_proximal else None

    def _logp(self, model, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        return completion_logps(scorer_of(model), batch, self.temperature)

    def count(self, mb: TokenBatch) -> float:
        """What the loss of `mb` is divided by (its trained tokens or sequences, across ranks):
        given to each of its micro-batches, their summed gradients are the whole one's."""
        n = _global_count(mb, self.loss.agg)
        return n if n is not None else float(AGGREGATIONS.impl(self.loss.agg).count(mb.loss_mask.float()).clamp(min=1))

    def __call__(self, model, mb: TokenBatch, rows: torch.Tensor, normalizer: float | None = None) -> Step:
        logp, aux = self._logp(model, mb)
        value, m = self.loss(logp, mb.old_logp, self.advantages[rows], mb.loss_mask,
                             proximal_logp=None if self.prox_logp is None else self.prox_logp[rows],
                             ref_logp=None if self.ref_logp is None else self.ref_logp[rows],
                             normalizer=normalizer if normalizer is not None else _global_count(mb, self.loss.agg))
        return value, m, aux


def completion_logps(score: CompletionLogprobs, batch: TokenBatch,
                     temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp [N, L] of the trained tokens (0 elsewhere), an MoE router's aux loss or None): packed
    rows or the shared prefix run once and only trained positions are projected onto the
    vocabulary (trainer/logprobs.CompletionLogprobs, built once per model); MoE models take the
    full path with their router loss and router replay."""
    if score.moe:
        logp, aux = logprobs_and_aux(score.model, batch, temperature)
        return logp * batch.loss_mask, aux
    return score(batch, temperature), None


@dataclass
class TokenNLL:
    """SFT: the mean NLL of the batch's trained tokens (loss_mask 1)."""

    score: CompletionLogprobs

    def prepare(self, model, ref, batch) -> None:
        pass

    def count(self, mb: TokenBatch) -> float:
        """What the loss of `mb` is divided by, its trained tokens: given to each of its
        micro-batches, their summed gradients are the whole one's."""
        return float(mb.loss_mask.sum().clamp(min=1))

    def __call__(self, model, mb: TokenBatch, rows: torch.Tensor, normalizer: float | None = None) -> Step:
        logp, aux = completion_logps(self.score, mb)
        loss, m = sft_loss(logp, mb.loss_mask, normalizer)
        return loss, {"train_loss": m["nll"]}, aux


@dataclass
class Preference:
    """DPO on P pairs: rows 0..P-1 of the batch are the chosen answers, rows P..2P-1 the rejected
    ones in the same order. ref_chosen / ref_rejected: [P] the reference's sequence log-probs
    (None when reference-free)."""

    loss: DPOLoss
    score: CompletionLogprobs
    ref_chosen: torch.Tensor | None
    ref_rejected: torch.Tensor | None

    def prepare(self, model, ref, batch) -> None:
        pass

    def __call__(self, model, mb: TokenBatch, rows: torch.Tensor) -> Step:
        logp, aux = completion_logps(self.score, mb)
        p = len(mb) // 2
        seq = sequence_logps(logp, mb.loss_mask, self.loss.length_normalize)
        nll = -(logp * mb.loss_mask).sum(-1)[:p] / mb.loss_mask[:p].sum(-1).clamp(min=1)
        loss, m = self.loss(seq[:p], seq[p:], self.ref_chosen, self.ref_rejected, nll)
        return loss, {"train_loss": m["loss"], "reward_margin": m["reward_margin"],
                      "reward_accuracy": m["reward_accuracy"]}, aux
