"""The one optimizer of every run (GRPO, SFT, DPO, RFT, nano's pre-training): AdamW with a
warm-up and an optional cosine, and the update that clips and steps it.

    build_optimizer(params, OptimSpec) -> (AdamW, LambdaLR)
    optimizer_step(model, opt, sched, loss, max_grad_norm) -> grad norm
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass(frozen=True)
class OptimSpec:
    """What the optimizer is: AdamW's rate, betas and decay, the schedule and the clipping.

    decay_steps None: constant after the warm-up; else a cosine to lr * min_lr_ratio at that step.
    fused: torch's one-kernel AdamW (every tensor in one call). It is faster (AdamW 2.8 -> 1.1 ms
    of a 17 ms nano SFT step) but rounds differently from the per-tensor loop, so runs whose
    published figures came from the loop (GRPO, nano's pre-training) keep it off.
    """

    lr: float
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    decay_steps: int | None = None
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    fused: bool = False


def lr_factor(step: int, *, warmup_steps: int, decay_steps: int | None, min_ratio: float) -> float:
    """Learning-rate multiplier at optimizer step `step`: linear warm-up, then constant
    (`decay_steps` None) or a cosine down to `min_ratio` at `decay_steps` and flat after it."""
    warm = min(1.0, (step + 1) / (warmup_steps + 1))
    if decay_steps is None:
        return warm
    done = min(1.0, max(0, step - warmup_steps) / max(1, decay_steps - warmup_steps))
    return warm * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * done)))


def build_optimizer(params: Iterable[torch.nn.Parameter], spec: OptimSpec
                    ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` and its schedule. `spec.fused` is honoured where torch has the kernel
    (floating-point parameters on the CPU or a GPU) and ignored elsewhere."""
    params = list(params)
    fused = spec.fused and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay, betas=spec.betas,
                            **({"fused": True} if fused else {}))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, functools.partial(lr_factor, warmup_steps=spec.warmup_steps, decay_steps=spec.decay_steps,
                               min_ratio=spec.min_lr_ratio))
    return opt, sched


def optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, sched, loss: torch.Tensor | None,
                   max_grad_norm: float, reduce=None) -> torch.Tensor:
    """One update: backward, `reduce(model)` (data parallel: sum gradients across ranks), clip
    to `max_grad_norm`, step the optimizer and the schedule. Returns the gradient norm. `loss`
    None: the gradients are already there (accumulated over micro-batches by the caller).

    A fused Adam(W) divides the gradients by its `grad_scale` as it reads them, the hook torch's
    GradScaler uses: clipping goes there instead of a pass of its own over every gradient
    (clip_grad_norm_'s multiply; ~2% of a nano SFT step). Same update up to rounding
    (g / (norm / max) instead of g * (max / norm))."""
    if loss is not None:
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
