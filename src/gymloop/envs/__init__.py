"""Environments (the gym): a name -> constructor registry."""
from __future__ import annotations

from typing import Any, Callable

from .arith import ArithConfig, ArithEnv
from .base import Environment, Score, StepResult, Task, split_of

REGISTRY: dict[str, Callable[..., Environment]] = {
    "arith": lambda **kw: ArithEnv(ArithConfig(**kw)),
}


def make_env(name: str, **options: Any) -> Environment:
    """Build a registered environment; unknown names list the known ones."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(REGISTRY)}") from None
    return factory(**options)


__all__ = ["REGISTRY", "ArithConfig", "ArithEnv", "Environment", "Score", "StepResult", "Task",
           "make_env", "split_of"]
