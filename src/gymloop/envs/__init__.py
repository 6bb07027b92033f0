"""Environments (the gym): a name -> constructor registry, validation, JSONL task files."""
from __future__ import annotations

from typing import Any, Callable

from .arith import ArithConfig, ArithEnv
from .base import Environment, Score, StepResult, Task, play, split_of


def _tools(**kw) -> Environment:
    from .tools import ToolsConfig, ToolsEnv

    return ToolsEnv(ToolsConfig(**kw))


def _code(**kw) -> Environment:
    from .code import CodeConfig, CodeEnv

    return CodeEnv(CodeConfig(**kw))


def _code_repo(**kw) -> Environment:
    from .code import CodeConfig, CodeEnv

    return CodeEnv(CodeConfig(**{"variant": "repo", **kw}))


def _humaneval(**kw) -> Environment:
    from .humaneval import HumanEvalConfig, HumanEvalEnv

    return HumanEvalEnv(HumanEvalConfig(**kw))


def _reasoning_gym(**kw) -> Environment:
    from .reasoning_gym import ReasoningGymConfig, ReasoningGymEnv

    return ReasoningGymEnv(ReasoningGymConfig(**kw))


REGISTRY: dict[str, Callable[..., Environment]] = {
    "arith": lambda **kw: ArithEnv(ArithConfig(**kw)),
    "tools": _tools,
    "code": _code,
    "code-repo": _code_repo,
    "humaneval": _humaneval,
    "reasoning_gym": _reasoning_gym,
}
DESCRIPTIONS = {
    "arith": "procedural arithmetic; the last integer of the reply is checked",
    "tools": "multi-turn tool use over a versioned inventory API (version: 1 or 2)",
    "code": "write a Python function; hidden tests run in the sandbox",
    "code-repo": "fix a bug in a tiny multi-file project; its own unittest suite decides",
    "humaneval": "the 164 HumanEval problems, their own tests in the sandbox",
    "reasoning_gym": "any reasoning-gym dataset (dataset: NAME), scored by its own scorer",
}


def make_env(name: str, **options: Any) -> Environment:
    """Build a registered environment. `tools@v2` is shorthand for tools with version=2."""
    if "@v" in name:
        name, version = name.split("@v", 1)
        options = {**options, "version": int(version)}
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(REGISTRY)}") from None
    return factory(**options)


__all__ = ["DESCRIPTIONS", "REGISTRY", "ArithConfig", "ArithEnv", "Environment", "Score", "StepResult",
           "Task", "make_env", "play", "split_of"]
