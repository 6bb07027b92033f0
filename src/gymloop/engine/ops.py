"""Forward pieces of a Llama decoder layer shared by generation (engine/llama.py) and training's
layer with its backward written out (trainer/layer.py). Shapes: B rows, h heads, T positions, D
head size."""
from __future__ import annotations

from typing import NamedTuple

import torch


class Shape(NamedTuple):
    """What a layer's weights do not say: query heads, key/value heads, head size, RMSNorm eps."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split layout (HF Llama's x * cos + rotate_half(x) * sin): x [B, h,
    T, D]; cos [B, 1, T, D]; sin [B, 1, T, D] with its first half negated, so that rotate_half(x)
    * sin is x rolled by D/2 times it (four kernels instead of five, and the same bits)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def split_heads(y: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T, n * D] -> [B, n, T, D] (a view)."""
    B, T, _ = y.shape
    return y.view(B, T, n, -1).transpose(1, 2)


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """[B, n, T, D] -> [B, T, n * D] (contiguous)."""
    B, n, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, n * D)


def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True: the query sees the key) as attention's additive mask: 0 / -inf."""
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, float("-inf"))
