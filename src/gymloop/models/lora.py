"""LoRA adapters with `peft`: a fine-tuning job's `hyperparameters.lora` or a run's `grpo.lora`
wraps the model in adapters before training, and only they train. A saved LoRA model
(models/checkpoint.save_model) is the merged model (served, evaluated and continued from like any
model directory) and, beside it in `adapter/`, the adapter in PEFT's format
(adapter_config.json + adapter_model.safetensors), which a Hugging Face user loads with
`PeftModel.from_pretrained(base, adapter_dir)`.

While it trains, a LoRA model of the Llama family generates and is scored on the native path
(engine/llama.py) with each projection's weight taken as base + scaling * B A (linear_weights):
peft's own forward adds a low-rank product to every projection of every token, and the HF
backend it needs had none of the native path's prefix sharing.
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


def adapter_config(model: torch.nn.Module) -> dict:
    """The adapter's adapter_config.json (peft's format) as a dict: what an engine that serves
    adapters (vLLM) reads beside the adapter's tensors."""
    import json

    return json.loads(json.dumps(model.peft_config["default"].to_dict(), default=sorted))


def is_lora(model: torch.nn.Module) -> bool:
    # peft is imported only once a model has adapters (every wrapped model carries peft_config)
    return hasattr(model, "peft_config")


# The decoder layers' projections the native engine computes (engine/llama.py); an adapter
# anywhere else (the embeddings, the output head) runs only in the model's own forward.
NATIVE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def native_blocker(model: torch.nn.Module) -> str | None:
    """Why the native engine cannot compute what a peft model's LoRA forward does (None: it can,
    as the base weights plus each active adapter's scaling * B A; see linear_weights). A plain
    model: None."""
    if not is_lora(model):
        return None
    import torch
    from peft.tuners.lora import Linear as LoraLinear, LoraLayer

    for name, m in model.named_modules():
        if not isinstance(m, LoraLayer):
            continue
        if type(m) is not LoraLinear or name.rsplit(".", 1)[-1] not in NATIVE_TARGETS:
            return f"a LoRA adapter on {name} (the native path adapts only {', '.join(NATIVE_TARGETS)})"
        if m.disable_adapters:
            return f"{name}'s adapters are disabled"
        for a in m.active_adapters:
            if m.lora_variant.get(a) is not None or m.use_dora.get(a) or m.lora_bias.get(a):
                return f"{name}: a LoRA variant (DoRA, bias) runs in the model's own forward"
            if isinstance(m.lora_dropout[a], torch.nn.Dropout) and m.lora_dropout[a].p > 0:
                return f"{name}: LoRA dropout {m.lora_dropout[a].p} runs in the model's own forward"
    return None


def linear_weights(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [out, in], bias [out] or None) of the product `module` computes: a plain linear's
    own parameters (by reference), or for a peft LoRA linear its base weight plus each active
    adapter's scaling * B A (peft's get_delta_weight; a new tensor, differentiable in the adapters:
    a forward on it trains them as peft's own forward does, without dropout, which native_blocker
    rules out). A merged adapter is already in the base weight; disabled adapters add nothing."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return module.weight, module.bias
    w = base.weight
    if not (module.merged or module.disable_adapters):
        for a in module.active_adapters:
            if a in module.lora_A:
                w = w + module.get_delta_weight(a)
    return w, base.bias
