"""The trainer: turns scored rollouts into optimizer steps, and saves/restores its state.

Stages, each its own function: `rollouts_to_batch` (episodes -> padded token batch) and
`Trainer.step` (the extra forward passes a loss needs, then optimizer steps). Advantages and
the loss itself are pure functions of `algorithms/`, passed in.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import re
from pathlib import Path
from typing import Sequence

import torch

from . import sharding
from ..algorithms.aggregation import AGGREGATIONS
from ..algorithms.losses import PolicyLoss
from ..engine.gemm import route_linears
from .logprobs import TokenBatch, logprobs_and_aux, make_batch, token_logprobs
from ..rollout.episodes import Rollout


def rollouts_to_batch(rollouts: Sequence[Rollout], pad_id: int, replay: bool = False) -> TokenBatch:
    """Prompt + episode tokens; loss on model-produced tokens only. With `replay`, the MoE
    routing the rollouts were sampled with rides along (rows without one route themselves)."""
    seqs = [r.prompt_ids + r.token_ids for r in rollouts]
    masks = [[0] * len(r.prompt_ids) + r.mask for r in rollouts]
    logps = [[0.0] * len(r.prompt_ids) + r.logprobs for r in rollouts]
    batch = make_batch(seqs, masks, logps, pad_id)
    recorded = [r.routing for r in rollouts if r.routing is not None]
    if replay and recorded:
        layers, _, k = recorded[0].shape
        batch.routing = torch.full((len(seqs), layers, batch.input_ids.shape[1], k), -1, dtype=torch.long)
        for i, (r, s) in enumerate(zip(rollouts, seqs)):
            if r.routing is not None and r.routing.shape[1] == len(s) - 1:
                batch.routing[i, :, :len(s) - 1] = torch.as_tensor(r.routing, dtype=torch.long)
    return batch


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _global_count(mb: TokenBatch, agg: str) -> float | None:
    """Data parallel: the whole batch's token (or sequence) count across ranks; None alone.
    Sequences count when they have a trained token (as in the loss), so a rank's padding
    rows (see cluster.ray_trainer) change nothing."""
    if not _distributed():
        return None
    n = AGGREGATIONS.impl(agg).count(mb.loss_mask.float()).detach().clone().float()
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


def optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, sched, loss: torch.Tensor,
                   max_grad_norm: float, reduce=None) -> torch.Tensor:
    """One update: backward, `reduce(model)` (data parallel: sum gradients across ranks), clip
    to `max_grad_norm`, step the optimizer and the schedule. Returns the gradient norm.

    A fused Adam(W) (torch's one-kernel update, what fine-tuning jobs use) divides the gradients
    by its `grad_scale` as it reads them, the hook torch's GradScaler uses: clipping goes there
    instead of a pass of its own over every gradient (clip_grad_norm_'s multiply; ~2% of a nano
    SFT step). Same update up to rounding (g / (norm / max) instead of g * (max / norm))."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if reduce is not None:
        reduce(model)
    if opt.defaults.get("fused"):
        # the optimizer's own list: walking the model's modules for its parameters costs more than the norm
        grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        # clip_grad_norm_'s factor max / (norm + 1e-6), capped at 1, as a divisor
        opt.grad_scale = ((norm + 1e-6) / max_grad_norm).clamp(min=1.0)
        try:
            opt.step()
        finally:
            del opt.grad_scale
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
    sched.step()
    return norm


def trainable_parameters(model: torch.nn.Module, patterns: Sequence[str]) -> list[torch.nn.Parameter]:
    """The parameters to train: all, or (with `patterns`) those whose name matches one of the
    regular expressions; the others are frozen (requires_grad False), so autograd does not go
    below the lowest trained one."""
    if not patterns:
        return [p for p in model.parameters() if p.requires_grad]      # LoRA: the adapters
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
        route_linears(model)                    # its products through oneDNN where MKL runs AVX2 (engine/gemm.py)
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
            route_linears(self.ref)
        else:
            self.ref = copy.deepcopy(model).eval().requires_grad_(False) if ref_model else None

    def step(self, batch: TokenBatch, advantages: torch.Tensor, loss: PolicyLoss, *, temperature: float,
             epochs: int = 1, minibatches: int = 1) -> dict:
        """`epochs` x `minibatches` optimizer steps of `loss` on one batch of rollouts.

        batch: [N, L]; advantages: [N]. The ratio is taken against log-probs fixed before the
        first update (the behaviour log-probs stored in the batch, or the proximal policy's when
        the loss corrects the behaviour mismatch), so later passes over the batch stay correct.
        """
        self.model.train()
        device = next(self.model.parameters()).device      # rollouts arrive on the CPU
        batch, advantages = batch.to(device), advantages.to(device)
        if loss.needs_ref and self.ref is None:
            raise ValueError("the loss has a KL term (beta > 0) but the trainer was built without a reference model")
        with torch.no_grad():
            ref_logp = token_logprobs(self.ref, batch, temperature) if loss.needs_ref else None
            # the trainer's own weights before this step: the decoupled-PPO proximal policy
            prox_logp = token_logprobs(self.model, batch, temperature) if loss.needs_proximal else None
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
                logp, aux = logprobs_and_aux(self.model, mb, temperature)
                value, m = loss(logp, mb.old_logp, advantages[idx], mb.loss_mask,
                                proximal_logp=None if prox_logp is None else prox_logp[idx],
                                ref_logp=None if ref_logp is None else ref_logp[idx],
                                normalizer=_global_count(mb, loss.agg))
                if aux is not None:       # MoE: the router's load-balancing loss, as in pre-training
                    # each rank's is a mean over its own tokens: summed gradients count it once
                    world = torch.distributed.get_world_size() if _distributed() else 1
                    value = value + aux / world
                    m["router_aux_loss"] = aux.item()
                m["grad_norm"] = self._apply(value)
                for k, v in m.items():
                    agg[k] = agg.get(k, 0.0) + v
                count += 1
        self.model.eval()
        return {k: v / count for k, v in agg.items()}

    def _apply(self, loss: torch.Tensor) -> float:
        # FSDP reduce-scattered the gradients in backward; whole replicas sum them here
        norm = optimizer_step(self.model, self.opt, self.sched, loss, self.max_grad_norm,
                              reduce=None if self.sharded else _all_reduce_grads)
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
