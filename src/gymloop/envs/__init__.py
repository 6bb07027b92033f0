"""Environments (the gym): the registry of names (built-ins, plugins, `module:factory`),
validation, JSONL task files. docs/environments.md describes the protocol."""
from __future__ import annotations

from typing import Any

from .arith import ArithConfig, ArithEnv
from .base import Environment, Score, StepResult, Task, play, split_of
from .registry import GROUP, EnvEntry, Registry, rebuilds_tasks

# The process's table of environment names (plugins are read from their entry points on demand).
REGISTRY = Registry()


def register_env(name: str, factory, description: str) -> None:
    """Make `name` buildable by `make_env`, configs and the CLI (`factory(**options) -> Environment`)."""
    REGISTRY.register(name, factory, description)


def make_env(name: str, **options: Any) -> Environment:
    """Build an environment by name (`tools@v2` is shorthand for tools with version=2), by a
    plugin's entry-point name, or by `module:factory`."""
    return REGISTRY.make(name, **options)


__all__ = ["GROUP", "REGISTRY", "ArithConfig", "ArithEnv", "EnvEntry", "Environment", "Registry", "Score",
           "StepResult", "Task", "make_env", "play", "rebuilds_tasks", "register_env", "split_of"]
