"""The trainer: turns scored rollouts into optimizer steps, and saves/restores its state.

Stages, each its own function: `advantages_for` (rewards -> advantages per group),
`rollouts_to_batch` (episodes -> padded token batch), `Trainer.grpo_step` (loss and
optimizer steps). The loss itself is the pure `algorithms.grpo.grpo_loss`.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from . import sharding
from ..algorithms.grpo import LossAgg, group_advantages, grpo_loss
from .logprobs import TokenBatch, make_batch, token_logprobs
from ..rollout.episodes import Rollout


@dataclass
class Advantages:
    rollouts: list[Rollout]      # the rollouts kept for training
    advantages: torch.Tensor     # [len(rollouts)]
    groups: int                  # groups considered (with >= 2 valid members)
    zero_signal_groups: int      # groups whose rewards were all equal


def advantages_for(rollouts: Sequence[Rollout], group_size: int, scale_std: bool,
                   drop_zero_signal: bool) -> Advantages:
    """Group-normalised advantages. Groups are consecutive runs of `group_size` rollouts.

    Rollouts with an infrastructure error are excluded before normalising, so a crashed
    sandbox never counts as a failed attempt.
    """
    kept, advs, groups, zero = [], [], 0, 0
    for start in range(0, len(rollouts), group_size):
        grp = [r for r in rollouts[start:start + group_size] if r.ok]
        if len(grp) < 2:
            continue
        groups += 1
        adv, z = group_advantages(torch.tensor([r.reward for r in grp]), len(grp), scale_std)
        if bool(z[0]):
            zero += 1
            if drop_zero_signal:
                continue
        kept += grp
        advs.append(adv)
    adv = torch.cat(advs) if advs else torch.zeros(0)
    return Advantages(kept, adv, groups, zero)


def rollouts_to_batch(rollouts: Sequence[Rollout], pad_id: int) -> TokenBatch:
    """Prompt + episode tokens; loss on model-produced tokens only."""
    seqs = [r.prompt_ids + r.token_ids for r in rollouts]
    masks = [[0] * len(r.prompt_ids) + r.mask for r in rollouts]
    logps = [[0.0] * len(r.prompt_ids) + r.logprobs for r in rollouts]
    return make_batch(seqs, masks, logps, pad_id)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _global_count(mb: TokenBatch, agg: str) -> float | None:
    """Data parallel: the whole batch's token (or sequence) count across ranks; None alone.
    Sequences count when they have a trained token (as in the loss), so a rank's padding
    rows (see cluster.ray_trainer) change nothing."""
    if not _distributed():
        return None
    n = mb.loss_mask.sum() if agg == "token-mean" else (mb.loss_mask.sum(-1) > 0).sum()
    n = n.detach().clone().float()
    torch.distributed.all_reduce(n)
    return float(n.clamp(min=1))


def _all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum gradients over ranks (each rank's loss is already divided by the global count).

    Gradients are flattened into one bucket so a step is one collective, not one per tensor.
    """
    if not _distributed():
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def lr_factor(step: int, *, warmup_steps: int, decay_steps: int | None, min_ratio: float) -> float:
    """Learning-rate multiplier at optimizer step `step`: linear warm-up, then constant
    (`decay_steps` None) or a cosine down to `min_ratio` at `decay_steps` and flat after it."""
    warm = min(1.0, (step + 1) / (warmup_steps + 1))
    if decay_steps is None:
        return warm
    done = min(1.0, max(0, step - warmup_steps) / max(1, decay_steps - warmup_steps))
    return warm * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * done)))


def trainable_parameters(model: torch.nn.Module, patterns: Sequence[str]) -> list[torch.nn.Parameter]:
    """The parameters to train: all, or (with `patterns`) those whose name matches one of the
    regular expressions; the others are frozen (requires_grad False), so autograd does not go
    below the lowest trained one."""
    if not patterns:
        return list(model.parameters())
    keep = []
    for name, p in model.named_parameters():
        p.requires_grad_(any(re.search(pat, name) for pat in patterns))
        if p.requires_grad:
            keep.append(p)
    if not keep:
        names = [n for n, _ in model.named_parameters()]
        raise ValueError(f"grpo.train_only {list(patterns)} matches no parameter; names look like {names[:3]}")
    return keep


class Trainer:
    """AdamW over a model's parameters with warm-up, clipping and checkpoints."""

    def __init__(self, model: torch.nn.Module, lr: float, *, weight_decay: float = 0.0,
                 warmup_steps: int = 0, max_grad_norm: float = 1.0,
                 ref_model: bool | torch.nn.Module = False,
                 betas: tuple[float, float] = (0.9, 0.99), decay_steps: int | None = None,
                 min_lr_ratio: float = 0.1, train_only: Sequence[str] = ()) -> None:
        self.model = model
        params = trainable_parameters(model, train_only)
        self.opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, functools.partial(lr_factor, warmup_steps=warmup_steps, decay_steps=decay_steps,
                                        min_ratio=min_lr_ratio))
        self.max_grad_norm = max_grad_norm
        self.step_count = 0
        # Fixed from here on: FSDP shards a model before its optimizer is built (sharding.py).
        self.sharded = sharding.is_sharded(model)
        # True: a frozen copy of the model as it is now. A sharded (FSDP) model cannot be
        # copied, so its ranks pass a reference they built and sharded themselves.
        if isinstance(ref_model, torch.nn.Module):
            self.ref = ref_model.eval().requires_grad_(False)
        else:
            self.ref = copy.deepcopy(model).eval().requires_grad_(False) if ref_model else None

    def grpo_step(self, batch: TokenBatch, advantages: torch.Tensor, *, temperature: float,
                  clip_low: float, clip_high: float, beta: float, loss_agg: LossAgg,
                  epochs: int = 1, minibatches: int = 1) -> dict:
        """`epochs` x `minibatches` optimizer steps on one batch of rollouts.

        batch: [N, L]; advantages: [N]. The PPO ratio is taken against the behaviour
        log-probs stored in the batch, so later passes over the same batch stay correct.
        """
        self.model.train()
        device = next(self.model.parameters()).device      # rollouts arrive on the CPU
        batch, advantages = batch.to(device), advantages.to(device)
        ref_logp = None
        if self.ref is not None and beta > 0:
            with torch.no_grad():
                ref_logp = token_logprobs(self.ref, batch, temperature)
        n = len(batch)
        agg: dict[str, float] = {}
        count = 0
        # Seeded by the step count, so a run is reproducible from its config.
        gen = torch.Generator().manual_seed(self.step_count)
        for _ in range(epochs):
            order = (torch.randperm(n, generator=gen) if minibatches > 1 else torch.arange(n)).to(device)
            # tensor_split, not chunk: always `minibatches` parts, so every data-parallel
            # rank runs the same number of collectives
            for idx in order.tensor_split(minibatches):
                mb = batch.select(idx)
                logp = token_logprobs(self.model, mb, temperature)
                loss, m = grpo_loss(logp, mb.old_logp, advantages[idx], mb.loss_mask,
                                    clip_low=clip_low, clip_high=clip_high,
                                    ref_logp=None if ref_logp is None else ref_logp[idx],
                                    beta=beta, agg=loss_agg, normalizer=_global_count(mb, loss_agg))
                m["grad_norm"] = self._apply(loss)
                for k, v in m.items():
                    agg[k] = agg.get(k, 0.0) + v
                count += 1
        self.model.eval()
        return {k: v / count for k, v in agg.items()}

    def _apply(self, loss: torch.Tensor) -> float:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if not self.sharded:              # FSDP reduce-scattered them in backward
            _all_reduce_grads(self.model)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        self.sched.step()
        self.step_count += 1
        return float(sharding.full(norm))

    def state(self) -> dict:
        """Optimizer, scheduler and step count (the model is saved by checkpoint.save_model).
        Under FSDP a collective, and the optimizer part is whole on rank 0 only."""
        opt = sharding.optimizer_state(self.model, self.opt) if self.sharded else self.opt.state_dict()
        return {"opt": opt, "sched": self.sched.state_dict(), "step": self.step_count}

    def set_state(self, state: dict) -> None:
        if self.sharded:
            sharding.load_optimizer_state(self.model, self.opt, state["opt"])
        else:
            self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.step_count = state["step"]

    def save_state(self, path: str | Path) -> None:
        write_state(path, self.state())

    def load_state(self, path: str | Path) -> None:
        self.set_state(read_state(path))

    def close(self) -> None:
        """Nothing to release in-process (a TrainerGroup stops its actors)."""


def write_state(path: str | Path, state: dict) -> None:
    """A trainer's `state()` into a checkpoint directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save({"opt": state["opt"], "sched": state["sched"]}, path / "trainer_state.pt")
    (path / "trainer.json").write_text(json.dumps({"step": state["step"]}))


def read_state(path: str | Path) -> dict:
    path = Path(path)
    state = torch.load(path / "trainer_state.pt", weights_only=True)
    return {**state, "step": json.loads((path / "trainer.json").read_text())["step"]}
