"""Algorithms: pure functions from a batch to a loss."""
from .grpo import grpo_loss, group_advantages
from .sft import sft_loss

__all__ = ["grpo_loss", "group_advantages", "sft_loss"]
