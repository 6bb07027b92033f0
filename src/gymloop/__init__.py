"""gymloop: continuous post-training of agents.

The public API (frozen early; see STYLE.md): the engine, the environments, the GRPO loss,
the trainer, evaluation and the `train` job.
"""
from .algorithms import grpo_loss, group_advantages, sft_loss
from .chat import ChatTokenizer
from .checkpoint import load_model, resolve_model, save_model
from .config import TrainConfig, load_config
from .engine import Engine, SamplingParams
from .envs import Environment, Score, Task, make_env
from .evaluate import evaluate, pass_at_k
from .rollout import Rollout, collect

__version__ = "0.1.0"

__all__ = [
    "ChatTokenizer", "Engine", "Environment", "Rollout", "SamplingParams", "Score", "Task",
    "TrainConfig", "collect", "evaluate", "group_advantages", "grpo_loss", "load_config",
    "load_model", "make_env", "pass_at_k", "resolve_model", "save_model", "sft_loss",
]
