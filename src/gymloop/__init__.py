"""gymloop: continuous post-training of agents.

The public API (frozen early: what a user imports stays importable): the engine, the environments, the policy losses,
the trainer, evaluation and the `train` job. Names are imported on first use (PEP 562), so
`import gymloop` and the `gymloop` CLI start without importing torch.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "PolicyLoss": ".algorithms", "group_advantages": ".algorithms", "sft_loss": ".algorithms",
    "ChatTokenizer": ".models.chat",
    "load_model": ".models.checkpoint", "save_model": ".models.checkpoint", "resolve_model": ".bases.registry",
    "TrainConfig": ".config", "load_config": ".config",
    "Engine": ".engine", "SamplingParams": ".engine",
    "Environment": ".envs", "Score": ".envs", "Task": ".envs", "make_env": ".envs", "register_env": ".envs",
    "evaluate": ".rollout.evaluate", "pass_at_k": ".rollout.evaluate",
    "Rollout": ".rollout.episodes", "collect": ".rollout.episodes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value          # later lookups skip this function
        return value
    raise AttributeError(f"module 'gymloop' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
