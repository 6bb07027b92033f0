"""The engine backends by name, and what each can do: declared once, here, and read by the configs
(their `engine_backend` field), the CLI (`--engine-backend`), the factory (engine/factory.py) and
the checks every command runs on its config before it starts anything. Free of torch, so a
config validates without importing it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    name: str
    description: str
    in_process: bool                        # generates in gymloop's process (the trainer's own tensors)
    can: frozenset[str]                     # see CAPABILITIES


# what a run may ask of its engine, and what it is called in an error
CAPABILITIES = {
    "router_replay": "MoE router replay (grpo.router_replay)",
    "bfloat16": "engine_dtype bfloat16",
    "lora": "LoRA adapters as weight versions (grpo.lora)",
}

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("auto", "gymloop's engine: the native llama path when the model supports it, else transformers' forward",
            True, frozenset({"router_replay", "bfloat16", "lora"})),
    Backend("llama", "gymloop's native batched sampler over the model's own weights (Llama-family models)", True,
            frozenset({"bfloat16", "lora"})),
    Backend("hf", "gymloop's sampler over transformers' forward (any causal LM; MoE router replay)", True,
            frozenset({"router_replay", "lora"})),
    Backend("vllm", "vLLM in its own process and venv (`make vllm`), fed each weight version", False,
            frozenset({"bfloat16", "lora"})),
)}
NAMES: tuple[str, ...] = tuple(BACKENDS)


def check_backend(name: str, *, router_replay: bool = False, dtype: str = "model", lora: bool = False) -> None:
    """A ValueError naming the first thing `name` cannot do of what a run asks."""
    if name not in BACKENDS:
        raise ValueError(f"unknown engine backend {name!r}; known: {', '.join(NAMES)}")
    asked = {"router_replay": router_replay, "bfloat16": dtype == "bfloat16", "lora": lora}
    for what, wanted in asked.items():
        if wanted and what not in BACKENDS[name].can:
            able = [b for b in NAMES if what in BACKENDS[b].can]
            raise ValueError(f"engine_backend {name} does not run {CAPABILITIES[what]} (backends that do: "
                             f"{', '.join(able)})")
