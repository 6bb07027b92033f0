"""Router replay for mixture-of-experts models: record which experts each token was routed to
(while the engine samples), and make a later forward pass (the trainer's) use those experts, so
the trained log-probs come from the routing that produced the sample even after the weights,
and with them the router's choices, have moved (R3, "rollout routing replay").

Routing is indexed like the model's own tensors: for a batch [N, L] it is [N, layers, L, k]
(expert ids, -1 where a position has none recorded: that position routes itself).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .parameters import moe_blocks


@dataclass
class Tape:
    """What the routers chose, one entry per forward pass: per layer, indices [B * T, k]."""

    calls: list[list[torch.Tensor]] = field(default_factory=list)


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The top-k routers of an MoE model, in layer order (empty for a dense model)."""
    return [b.gate for b in moe_blocks(model)]


def _hook(tape: Tape, layer: int, replay: torch.Tensor | None):
    def hook(router, args, out):
        logits, scores, idx = out                              # [B*T, E], [B*T, k], [B*T, k]
        if replay is not None:
            want = replay[:, layer].reshape(-1, idx.shape[-1]).to(idx.device)    # [B*T, k]
            use = (want[:, :1] >= 0)
            idx = torch.where(use, want, idx)
            # the scores of the replayed experts under *this* router: the gradient reaches it
            probs = torch.softmax(logits.float(), -1)
            picked = probs.gather(-1, idx)
            if getattr(router, "norm_topk_prob", True):
                picked = picked / picked.sum(-1, keepdim=True)
            scores = torch.where(use, picked.to(scores.dtype), scores)
            out = (logits, scores, idx)
        if layer == 0:
            tape.calls.append([])
        tape.calls[-1].append(idx.detach())
        return out
    return hook


@contextlib.contextmanager
def routing(model: torch.nn.Module, replay: torch.Tensor | None = None) -> Iterator[Tape]:
    """Within the block, every forward pass of `model` records its routers' choices on the
    returned tape, and with `replay` ([N, layers, L, k] for an [N, L] input) uses those experts
    wherever they are >= 0. A dense model records nothing."""
    tape = Tape()
    handles = [r.register_forward_hook(_hook(tape, i, replay)) for i, r in enumerate(routers(model))]
    try:
        yield tape
    finally:
        for h in handles:
            h.remove()


def rows_from_tape(tape: Tape, prompt_lens: list[int], gen_lens: list[int]) -> list[torch.Tensor]:
    """Per-row routing of one generation: the tape holds the prefill ([B, P] left-padded prompts)
    and then one call per decode step ([B, 1]); row b's positions are its prompt and every sampled
    token but the last (which was never fed back). Returns [layers, P_b + n_b - 1, k] per row."""
    if not tape.calls:
        return []
    b = len(prompt_lens)
    width = max(prompt_lens)
    layers = len(tape.calls[0])
    k = tape.calls[0][0].shape[-1]
    prefill = torch.stack([t.view(b, width, k) for t in tape.calls[0]])            # [layers, B, P, k]
    steps = [torch.stack([t.view(b, k) for t in call]) for call in tape.calls[1:]]  # each [layers, B, k]
    out = []
    for i, (p, n) in enumerate(zip(prompt_lens, gen_lens)):
        parts = [prefill[:, i, width - p:]] + [s[:, i, None] for s in steps[:max(0, n - 1)]]
        r = torch.cat(parts, 1)                                                     # [layers, p + n - 1, k]
        if r.shape[1] != p + n - 1 or r.shape[0] != layers:
            raise RuntimeError(f"routing of row {i}: {tuple(r.shape)} does not cover {p} + {n} - 1 positions")
        out.append(r)
    return out
