"""LoRA adapters with `peft`: a fine-tuning job's `hyperparameters.lora` or a run's `grpo.lora`
wraps the model in adapters before training, and only they train. A saved LoRA model
(models/checkpoint.save_model) is the merged model (served, evaluated and continued from like any
model directory) and, beside it in `adapter/`, the adapter in PEFT's format
(adapter_config.json + adapter_model.safetensors), which a Hugging Face user loads with
`PeftModel.from_pretrained(base, adapter_dir)`.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import torch

ADAPTER_DIR = "adapter"


class LoraOptions(BaseModel):
    """hyperparameters.lora of a job."""

    model_config = ConfigDict(extra="forbid")
    rank: int = Field(8, ge=1, le=256, description="Rank r of each adapter.")
    alpha: float = Field(16.0, gt=0, le=4096, description="Scale: the update is (alpha / r) B A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, max_length=32, description="Names of the linear layers that get adapters.")


def wrap(model: torch.nn.Module, options: dict, adapter: Path | None = None) -> torch.nn.Module:
    """The model with LoRA adapters (new, or `adapter`'s weights to resume from); only the
    adapters train. Raises ValueError when no target module is in the model."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    o = LoraOptions(**options)
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    if not names & set(o.target_modules):
        raise ValueError(f"lora target_modules {o.target_modules} match no linear layer of the model "
                         f"(it has: {', '.join(sorted(names))})")
    with _quiet_peft():
        if adapter is not None:
            return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
        return get_peft_model(model, LoraConfig(r=o.rank, lora_alpha=o.alpha, lora_dropout=o.dropout,
                                                target_modules=[t for t in o.target_modules if t in names],
                                                task_type="CAUSAL_LM"))


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """transformers deprecates an attribute name peft reads (is_gradient_checkpointing) when it
    wraps and saves; nothing for a user to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def save_adapter(model: torch.nn.Module, path: Path) -> None:
    """The adapter in PEFT's format (adapter_config.json, adapter_model.safetensors)."""
    with _quiet_peft():
        model.save_pretrained(str(path))


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the adapters folded into its weights; the training model is untouched."""
    return copy.deepcopy(model).merge_and_unload()


def is_lora(model: torch.nn.Module) -> bool:
    # peft is imported only once a model has adapters (every wrapped model carries peft_config)
    return hasattr(model, "peft_config")
