"""The trainer: turns scored rollouts into optimizer steps, and saves/restores its state.

Stages, each its own function: `rollouts_to_batch` (episodes -> padded token batch) and
`Trainer.step(batch, objective)` (the extra forward passes an objective needs, then optimizer
steps). Advantages and the losses are pure functions of `algorithms/`, wrapped as objectives
(objectives.py); the optimizer is optim.py's, the checkpoint state state.py's.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Sequence

import torch

from . import sharding
from ..engine.gemm import route_linears
from .logprobs import TokenBatch, make_batch
from .objectives import Objective, distributed
from .optim import OptimSpec, build_optimizer, optimizer_step
from .state import read_state, write_state
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


def training_rows(rollouts: Sequence[Rollout], advantages: torch.Tensor) -> tuple[list[Rollout], torch.Tensor]:
    """Each episode's training rows (an agent program's episode can leave several sequences:
    Rollout.sequences) and their advantages [rows]: every row of an episode gets the episode's."""
    rows = [s for r in rollouts for s in r.sequences()]
    if len(rows) == len(rollouts):
        return list(rollouts), advantages
    counts = torch.tensor([1 + len(r.segments) for r in rollouts])
    return rows, advantages.repeat_interleave(counts)


def _all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum gradients over ranks (each rank's loss is already divided by the global count).

    Gradients are flattened into one bucket so a step is one collective, not one per tensor.
    """
    if not distributed():
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


def _minibatches(n: int, parts: int, gen: torch.Generator | None, device) -> list:
    """Row indices of each minibatch of one epoch: all rows (one part), else the next
    permutation of `gen` in `parts` parts."""
    if parts == 1:
        return [slice(None)]
    order = torch.randperm(n, generator=gen).to(device)
    # tensor_split, not chunk: always `parts` parts, so every data-parallel rank runs the same
    # number of collectives
    return list(order.tensor_split(parts))


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
    """One optimizer (optim.build_optimizer) over a model's trainable parameters, the updates of
    any objective (objectives.py: GRPO's policy loss, SFT, DPO) and the state a run resumes from
    (state.py). Every run trains through it: `gymloop train`, loop rounds, fine-tuning jobs."""

    def __init__(self, model: torch.nn.Module, lr: float, *, weight_decay: float = 0.0,
                 warmup_steps: int = 0, max_grad_norm: float = 1.0,
                 ref_model: bool | torch.nn.Module = False,
                 betas: tuple[float, float] = (0.9, 0.99), decay_steps: int | None = None,
                 min_lr_ratio: float = 0.1, train_only: Sequence[str] = (), fused: bool = False,
                 micro_batch: int = 0) -> None:
        self.model = model
        # rows per forward/backward of an objective with a count() (GRPO's policy loss, SFT's NLL;
        # 0: a minibatch at once); gradients are summed over the parts, so the update is the same
        # and the memory that of one part. DPO's pairs have no count() and stay whole.
        self.micro_batch = micro_batch
        route_linears(model)                    # its products through oneDNN where MKL runs AVX2 (engine/gemm.py)
        self.spec = OptimSpec(lr=lr, betas=tuple(betas), weight_decay=weight_decay, warmup_steps=warmup_steps,
                              decay_steps=decay_steps, min_lr_ratio=min_lr_ratio, max_grad_norm=max_grad_norm,
                              fused=fused)
        self.opt, self.sched = build_optimizer(trainable_parameters(model, train_only), self.spec)
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

    @property
    def learning_rate(self) -> float:
        return self.sched.get_last_lr()[0]

    def step(self, batch: TokenBatch, objective: Objective, *, epochs: int = 1, minibatches: int = 1) -> dict:
        """`epochs` x `minibatches` optimizer steps of `objective` on one batch [N, L]; returns
        the mean of the objective's metrics over them, with the gradient norm. The model trains in
        train mode and is left in the mode it was in (GRPO's: eval, for its engine)."""
        was_training = self.model.training        # a fine-tuning job stays in train mode: no module walks
        if not was_training:
            self.model.train()
        device = next(self.model.parameters()).device      # rollouts arrive on the CPU
        batch = batch.to(device)
        objective.prepare(self.model, self.ref, batch)
        agg: dict[str, float] = {}
        count = 0
        # Seeded by the step count, so a run is reproducible from its config.
        gen = torch.Generator().manual_seed(self.step_count) if minibatches > 1 else None
        for _ in range(epochs):
            for idx in _minibatches(len(batch), minibatches, gen, device):
                mb = batch if minibatches == 1 else batch.select(idx)
                if self.micro_batch and len(mb) > self.micro_batch and hasattr(objective, "count"):
                    m = self._accumulated(objective, mb, torch.arange(len(batch), device=device)[idx])
                    for k, v in m.items():
                        agg[k] = agg.get(k, 0.0) + v
                    count += 1
                    continue
                value, m, aux = objective(self.model, mb, idx)
                if aux is not None:       # MoE: the router's load-balancing loss, as in pre-training
                    # each rank's is a mean over its own tokens: summed gradients count it once
                    world = torch.distributed.get_world_size() if distributed() else 1
                    value = value + aux / world
                    m["router_aux_loss"] = aux.item()
                m["grad_norm"] = self._apply(value)
                for k, v in m.items():
                    agg[k] = agg.get(k, 0.0) + v
                count += 1
        if not was_training:
            self.model.eval()
        return {k: v / count for k, v in agg.items()}

    def _accumulated(self, objective, mb: TokenBatch, rows: torch.Tensor) -> dict:
        """One update of an objective with a count() on `mb` [N, L] from parts of `micro_batch` rows: each
        part's loss divided by the whole minibatch's count, the gradients summed, then one step.
        Metrics: the loss summed, ratio_max the largest, the others weighted by trained tokens."""
        total = objective.count(mb)
        parts = torch.arange(len(mb), device=rows.device).split(self.micro_batch)
        tokens = mb.loss_mask.sum().clamp(min=1)
        self.opt.zero_grad(set_to_none=True)
        out: dict[str, float] = {}
        for part in parts:
            sub = mb.select(part)
            value, m, aux = objective(self.model, sub, rows[part], normalizer=total)
            if aux is not None:
                value = value + aux * len(part) / len(mb) / (torch.distributed.get_world_size() if distributed() else 1)
                m["router_aux_loss"] = aux.item()
            value.backward()
            share = float(sub.loss_mask.sum() / tokens)
            for k, v in m.items():
                out[k] = (out.get(k, 0.0) + v if k == "loss" else max(out.get(k, v), v) if k == "ratio_max"
                          else out.get(k, 0.0) + v * share)
        out["grad_norm"] = self._apply(None)
        return out

    def _apply(self, loss: torch.Tensor | None) -> float:
        # FSDP reduce-scattered the gradients in backward; whole replicas sum them here
        norm = optimizer_step(self.model, self.opt, self.sched, loss, self.max_grad_norm,
                              reduce=None if self.sharded else _all_reduce_grads)
        self.step_count += 1
        return float(sharding.full(norm))

    def state(self) -> dict:
        """Optimizer, scheduler, step count and the RNG (the model is saved by checkpoint.save_model).
        Under FSDP a collective, and the optimizer part is whole on rank 0 only."""
        opt = sharding.optimizer_state(self.model, self.opt) if self.sharded else self.opt.state_dict()
        return {"opt": opt, "sched": self.sched.state_dict(), "step": self.step_count, "rng": torch.get_rng_state()}

    def set_state(self, state: dict, rng: bool = False) -> None:
        """Restore optimizer, schedule and step count; with `rng`, torch's global RNG too (a run
        that resumes; not a new run that continues an optimizer)."""
        if self.sharded:
            sharding.load_optimizer_state(self.model, self.opt, state["opt"])
        else:
            self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.step_count = state["step"]
        if rng and state.get("rng") is not None:
            torch.set_rng_state(state["rng"])

    def save_state(self, path: str | Path, run: dict | None = None) -> None:
        """The trainer's state and the caller's `run` progress (see state.py) into checkpoint `path`."""
        write_state(path, {**self.state(), "run": run or {}})

    def load_state(self, path: str | Path, rng: bool = False) -> dict:
        """Restore from checkpoint `path` (see set_state); returns the run progress saved with it."""
        state = read_state(path)
        self.set_state(state, rng)
        return state["run"]

    def close(self) -> None:
        """Nothing to release in-process (a TrainerGroup stops its actors)."""
