"""Tied tensors: one helper for every weight transport."""
from __future__ import annotations

import torch


def unique_tensors(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A state dict with tied names (one tensor under several names, e.g. embeddings tied to the
    output layer) split into (first name -> tensor, each other name -> the first name it aliases),
    so a transport moves every tensor once and rebuilds the ties on the other side."""
    first: dict[tuple, str] = {}
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in state.items():
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            unique[name] = t
    return unique, aliases
