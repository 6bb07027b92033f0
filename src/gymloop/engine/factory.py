"""Every engine gymloop runs is built here: `make_engine(spec, model, tok)` by the backend's name
(gymloop/backends.py: the names and what each can do), so the callers (training, its collectors
and Ray workers, serving, the gate, evaluation) hold an `Engine` and never ask which one."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..backends import check_backend
from . import Engine, NativeEngine


@dataclass(frozen=True)
class EngineSpec:
    """What to build. backend: a name of backends.BACKENDS; dtype: what generation computes in
    (engine.ENGINE_DTYPES); the rest applies to vLLM (model_dir: the weights it starts from)."""

    backend: str = "auto"
    dtype: str = "model"
    record_routing: bool = False            # MoE router replay (native hf)
    max_batch: int = 256                    # native: most prompts in one generate pass
    version: int = 0
    model_dir: str | None = None
    url: str | None = None                  # vLLM already running there (started with gymloop's extension)
    seed: int = 0
    threads: int | None = None
    lora: dict | None = None                # a LoRA run's adapter config: versions are adapters
    vllm: dict = field(default_factory=dict)   # config.VLLMSettings as a dict: args, gpu_memory, kv_cache_gb
    shares_gpu: bool = False                # the trainer is on the same GPU (vLLM then takes less of it)

    def native(self) -> "EngineSpec":
        """The same run's in-process engine (a Ray driver's, when the workers run vLLM)."""
        return replace(self, backend="auto" if self.backend == "vllm" else self.backend)


def _native(spec: EngineSpec, model: torch.nn.Module, tok) -> Engine:
    return NativeEngine(model, tok.pad_token_id, backend=spec.backend, decode=tok.decode, max_batch=spec.max_batch,
                        version=spec.version, record_routing=spec.record_routing, dtype=spec.dtype)


def _vllm(spec: EngineSpec, model: torch.nn.Module, tok) -> Engine:
    from .vllm import VLLMEngine

    if spec.model_dir is None:
        raise ValueError("a vLLM engine starts from a model directory (EngineSpec.model_dir)")
    return VLLMEngine.start(Path(spec.model_dir), tok.pad_token_id, decode=tok.decode, version=spec.version,
                            url=spec.url, dtype=spec.dtype, seed=spec.seed, lora=spec.lora, threads=spec.threads,
                            settings=spec.vllm, shares_gpu=spec.shares_gpu)


BUILDERS: dict[str, Callable[[EngineSpec, torch.nn.Module, object], Engine]] = {
    "auto": _native, "llama": _native, "hf": _native, "vllm": _vllm}


def make_engine(spec: EngineSpec, model: torch.nn.Module, tok) -> Engine:
    """The engine `spec` names, over `model` (native: its tensors, shared) or its directory (vLLM);
    a ValueError first for what the backend cannot do."""
    check_backend(spec.backend, router_replay=spec.record_routing, dtype=spec.dtype, lora=spec.lora is not None)
    return BUILDERS[spec.backend](spec, model, tok)
