"""Algorithms: pure functions from a batch to a loss, in name -> implementation tables.

    advantages.py    ADVANTAGES     rewards of a group -> advantages (grpo, dr_grpo, rloo)
    losses.py        LOSSES         per-token policy losses (grpo, gspo, cispo) and PolicyLoss,
                                    which combines one with a correction, a KL and an aggregation
    corrections.py   CORRECTIONS    trainer/behaviour mismatch corrections (none, tis, icepop)
    aggregation.py   AGGREGATIONS   per-token losses -> a scalar (token-mean, seq-mean)
    shaping.py                      reward shaping before advantages (DAPO's overlong penalty, weighted components)
    sft.py                          supervised NLL
"""
from .advantages import ADVANTAGES, Advantages, advantages_for, group_advantages
from .aggregation import AGGREGATIONS, aggregate
from .corrections import CORRECTIONS
from .losses import LOSSES, PolicyLoss
from .sft import sft_loss
from .shaping import overlong_penalty, weighted_components

__all__ = ["ADVANTAGES", "AGGREGATIONS", "Advantages", "CORRECTIONS", "LOSSES", "PolicyLoss", "advantages_for",
           "aggregate", "group_advantages", "overlong_penalty", "sft_loss", "table", "weighted_components"]


def table() -> list[tuple[str, str, str]]:
    """(kind, name, one line) for every advantage, loss, correction and aggregation."""
    tables = {"advantage": ADVANTAGES, "loss": LOSSES, "correction": CORRECTIONS, "aggregation": AGGREGATIONS}
    return [(kind, name, line) for kind, t in tables.items() for name, line in t.describe()]
