"""Weights as a few flat byte buckets instead of hundreds of tensors: one object (or one
broadcast) per bucket moves them, and the receiver gets views, not copies.

    buckets, layout = pack(state_dict, bucket_bytes)      # sender
    weights = unpack(buckets, layout)                      # receiver: name -> tensor view
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .tensors import unique_tensors


@dataclass(frozen=True)
class Slot:
    name: str
    bucket: int
    offset: int          # bytes into the bucket
    dtype: str           # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]


def pack(state: dict[str, torch.Tensor], bucket_bytes: int = 64 << 20) -> tuple[list[np.ndarray], list[Slot]]:
    """Concatenate tensors into uint8 buckets of at most `bucket_bytes` each (a tensor larger
    than that gets a bucket of its own). Returns numpy arrays so object stores (Ray's plasma)
    can hand them to readers without a copy."""
    groups: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    unique, aliases = unique_tensors(state)           # tied names (one tensor) travel once
    for name, t in unique.items():
        n = t.numel() * t.element_size()
        if groups[-1] and size + n > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, t))
        size += n
    buckets, layout = [], []
    for b, group in enumerate(groups):
        total = sum(t.numel() * t.element_size() for _, t in group)
        buf = torch.empty(total, dtype=torch.uint8)
        off = 0
        for name, t in group:
            n = t.numel() * t.element_size()
            buf[off:off + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            layout.append(Slot(name, b, off, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
            off += n
        buckets.append(buf.numpy())
    at = {s.name: s for s in layout}
    layout += [Slot(name, at[src].bucket, at[src].offset, at[src].dtype, at[src].shape) for name, src in aliases.items()]
    return buckets, layout


def unpack(buckets: list[np.ndarray], layout: list[Slot]) -> dict[str, torch.Tensor]:
    """name -> tensor viewing the buckets' memory (read-only buckets stay read-only: copy into
    parameters, do not write through them)."""
    out = {}
    with warnings.catch_warnings():      # torch warns on read-only buffers; we only read them
        warnings.simplefilter("ignore", UserWarning)
        for s in layout:
            out[s.name] = _view(buckets[s.bucket], s)
    return out


def _view(bucket: np.ndarray, s: Slot) -> torch.Tensor:
    dtype = getattr(torch, s.dtype)
    n = int(np.prod(s.shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    if n == 0:
        return torch.empty(s.shape, dtype=dtype)
    return torch.frombuffer(memoryview(bucket[s.offset:s.offset + n]), dtype=dtype).reshape(s.shape)
