"""How many parameters a model has, and how many one token passes through (its active ones:
for a mixture of experts, the router's top-k experts, not all of them)."""
from __future__ import annotations

import torch


def moe_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The sparse MoE blocks of a transformers model: modules with a top-k router (`gate`, with
    `top_k` and `num_experts`) and their `experts` (Mixtral, Qwen3-MoE, ... in transformers 5)."""
    out = []
    for m in model.modules():
        gate, experts = getattr(m, "gate", None), getattr(m, "experts", None)
        if gate is not None and experts is not None and hasattr(gate, "top_k") and hasattr(gate, "num_experts"):
            out.append(m)
    return out


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(parameters, active parameters per token). Tied tensors count once. In each MoE block a
    token uses top_k of num_experts experts, so (1 - top_k / num_experts) of its experts'
    parameters are inactive; a dense model's active count is its total."""
    total = sum(p.numel() for p in model.parameters())
    inactive = 0.0
    for block in moe_blocks(model):
        expert = sum(p.numel() for p in block.experts.parameters())
        inactive += expert * (1 - block.gate.top_k / block.gate.num_experts)
    return total, total - round(inactive)
