"""How per-token losses become one scalar: one table, used by every loss and by the
data-parallel trainer's global count (so N ranks' gradients sum to one process's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .table import Table


@dataclass(frozen=True)
class Aggregation:
    total: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]   # (per_tok [N, L], mask [N, L]) -> sum
    count: Callable[[torch.Tensor], torch.Tensor]                 # mask [N, L] -> what the sum is divided by


def _seq_total(per_tok: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((per_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()


AGGREGATIONS: Table[Aggregation] = Table("loss aggregation", {
    "token-mean": (Aggregation(total=lambda per_tok, mask: (per_tok * mask).sum(), count=lambda mask: mask.sum()),
                   "mean over every trained token of the batch (DAPO): long answers are not down-weighted"),
    # sequences with no trained token (a rank's padding rows) do not count
    "seq-mean": (Aggregation(total=_seq_total, count=lambda mask: (mask.sum(-1) > 0).sum()),
                 "mean over sequences of each sequence's token mean (GRPO paper, GSPO)"),
})


def aggregate(per_tok: torch.Tensor, mask: torch.Tensor, agg: str, normalizer: float | None = None) -> torch.Tensor:
    """per_tok, mask: [N, L] -> scalar. `normalizer`: the global count across data-parallel
    ranks (None: this batch's own)."""
    a = AGGREGATIONS.impl(agg)
    mask = mask.float()
    return a.total(per_tok, mask) / (normalizer or a.count(mask).clamp(min=1))
