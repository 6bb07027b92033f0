"""Where a model runs: device placement, one place for the engine, the trainer and the actors."""
from __future__ import annotations

import torch


def to_gpu(model: torch.nn.Module, who: str) -> torch.nn.Module:
    """Move `model` to this process's GPU (on a Ray actor, the one Ray reserved for it), or say
    clearly why not; `who` names the setting that asked for it."""
    if not torch.cuda.is_available():
        raise ValueError(f"{who} asks for a GPU, but torch sees no GPU here (torch.cuda.is_available() "
                           "is False; a CPU-only torch wheel, or no GPU reserved for this process?)")
    return model.to("cuda")
