"""The generation engine: batched sampling on token ids, versioned weights.

`Engine` is the interface every caller holds: `generate(prompts, params)` takes token-id prompts
and returns the sampled ids and their log-probs; `load_weights(weights, version)` makes a weight
version current; `close()` releases what it holds. Two implementations: `NativeEngine` (gymloop's
batched sampler, in process, over the model's own tensors) and `vllm.VLLMEngine` (a vLLM server
in its own process). `factory.make_engine(spec, model, tok)` builds either, by backend name
(gymloop/backends.py says what each can do); callers never ask which one they hold.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import torch

from ..algorithms.table import Table
from ..models.routing import routers, rows_from_tape, routing
from .hf import HFBackend
from .llama import LlamaBackend, supports
from .sampling import Generation, GenerationBatch, SamplingParams, run_generation, sample_next

# name -> backend class; "auto" picks the native path when the model supports it.
BACKENDS: dict[str, Callable[[torch.nn.Module], object]] = {"llama": LlamaBackend, "hf": HFBackend}


# name -> the dtype the engine computes in (configs' `engine_dtype`); the trainer stays in the
# model's own. A sampled token's log-prob is then the engine's, not the trainer's: a GRPO step
# logs the difference (approx_kl_behaviour) and can correct it (grpo.correction: tis, icepop).
ENGINE_DTYPES: Table[torch.dtype | None] = Table("engine dtype", {
    "model": (None, "the model's own parameters, read by reference (exact: what the trainer computes)"),
    "bfloat16": (torch.bfloat16, "cast copies of the parameters, remade at each weight load: 2-3x faster "
                 "prefill on CPUs with AMX (engine/llama.py), the native backend only"),
})


def pick_backend(model: torch.nn.Module, name: str = "auto", dtype: str = "model") -> tuple[str, object]:
    """(name, backend): `auto` is the native path when the model supports it, else hf. A compute
    dtype other than the model's needs the native path (the hf backend runs the model's own
    forward on its own parameters)."""
    if name == "auto":
        name = "llama" if supports(model) is None else "hf"
    if name not in BACKENDS:
        raise ValueError(f"unknown engine backend {name!r}; known: auto, {', '.join(BACKENDS)}")
    compute = ENGINE_DTYPES.impl(dtype)
    if compute is None:
        return name, BACKENDS[name](model)
    if name != "llama":
        why = supports(model) or f"backend {name!r} was asked for"
        raise ValueError(f"engine dtype {dtype!r} needs the native llama backend: {why}")
    return name, LlamaBackend(model, dtype=compute)


@runtime_checkable
class Engine(Protocol):
    """What generates rollouts and answers: token ids in, sampled ids and behaviour log-probs out;
    versioned weight loads; close."""

    version: int                       # the weight version answering now
    backend_name: str                  # its name in backends.BACKENDS (the one resolved, for auto)

    @property
    def context(self) -> int | None:
        """Positions the model can attend over, if it says."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> GenerationBatch:
        """A completion for every prompt; `on_token(i, token_id)` streams prompt i's tokens."""

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int) -> int:
        """Make `weights` (state-dict names) version `version`; the bytes moved."""

    def close(self) -> None:
        """Release what it holds (a server it started)."""


class NativeEngine:
    """Generates from token ids with any HF causal LM; loads new weights without a rebuild."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, *, backend: str = "auto",
                 decode: Callable[[list[int]], str] | None = None, max_batch: int = 256,
                 version: int = 0, record_routing: bool = False, dtype: str = "model") -> None:
        """dtype: a name of ENGINE_DTYPES, the dtype generation computes in."""
        self.model = model.eval()
        self.pad_token_id = pad_token_id
        self.decode = decode
        self.max_batch = max_batch
        self.version = version
        self.backend_name, self.backend = pick_backend(model, backend, dtype)
        self.native_unsupported = supports(model)     # why the native backend cannot run it (None: it can)
        # MoE router replay: record every position's experts (needs the HF backend, which never
        # drops finished rows from its batch, so a row's decode steps are the tape's calls)
        self.record_routing = record_routing and bool(routers(model))
        if self.record_routing and self.backend.can_compact:
            raise ValueError("recording routing needs a backend that keeps finished rows (hf)")

    @property
    def context(self) -> int | None:
        """Positions the model can attend over (its config's max_position_embeddings), if it says."""
        return getattr(getattr(self.model, "config", None), "max_position_embeddings", None)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (the engine generates there)."""
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> GenerationBatch:
        """Sample a completion for every prompt. `on_token(i, token_id)` streams tokens of prompt i."""
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        t0 = time.perf_counter()
        outs: list[Generation] = []
        for i in range(0, len(prompts), self.max_batch):
            cb = None if on_token is None else (lambda j, t, o=i: on_token(o + j, t))
            chunk = prompts[i:i + self.max_batch]
            with routing(self.model) if self.record_routing else contextlib.nullcontext() as tape:
                got = run_generation(self.backend, chunk, params, self.pad_token_id, gen, self.decode,
                                     on_token=cb)
            if tape is not None:
                rows = rows_from_tape(tape, [len(p) for p in chunk], [len(g.token_ids) for g in got])
                for g, r in zip(got, rows):
                    g.routing = r.clone()          # out of inference mode: a trainer may index with it
            outs += got
        seconds = time.perf_counter() - t0
        return GenerationBatch(
            generations=outs, prompt_tokens=sum(len(p) for p in prompts),
            generated_tokens=sum(len(g.token_ids) for g in outs), seconds=seconds,
            version=self.version,
        )

    @torch.no_grad()
    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int) -> int:
        """Copy `weights` (name -> tensor, state-dict names) into the model in place.

        A tensor that already *is* the engine's parameter (trainer and engine sharing one
        model in process) is not copied. Returns the number of bytes copied.
        """
        own = self.model.state_dict(keep_vars=True)
        items = weights.items() if isinstance(weights, Mapping) else weights
        copied, seen = 0, set()
        for name, src in items:
            if name not in own:
                raise KeyError(f"weight {name!r} is not a parameter of the engine's model")
            dst = own[name]
            seen.add(name)
            if dst.data_ptr() == src.data_ptr():
                continue
            if dst.shape != src.shape:
                raise ValueError(f"weight {name!r}: shape {tuple(src.shape)} != {tuple(dst.shape)}")
            dst.data.copy_(src)
            copied += src.numel() * src.element_size()
        self.version = version
        if hasattr(self.backend, "refresh"):
            self.backend.refresh()
        return copied

    def close(self) -> None:
        """Nothing to release: the model is the caller's (an engine in another process, vLLM's,
        stops its server here)."""

    @torch.no_grad()
    def bind_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Make the model's parameters *be* `weights` (e.g. a shared-memory buffer): nothing
        is copied, and later writes to those tensors show through, so the owner of the
        buffer must not write it while this engine generates (SharedWeights ensures that)."""
        own = self.model.state_dict(keep_vars=True)
        missing = set(own) - set(weights)
        if missing:
            raise KeyError(f"bind_weights: no tensor for {sorted(missing)[:3]}")
        for name, dst in own.items():
            src = weights[name]
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise ValueError(f"weight {name!r}: {tuple(src.shape)} {src.dtype} != {tuple(dst.shape)} {dst.dtype}")
            dst.data = src
        self.version = version
        if hasattr(self.backend, "refresh"):
            self.backend.refresh()


__all__ = ["BACKENDS", "ENGINE_DTYPES", "Engine", "Generation", "GenerationBatch", "NativeEngine", "SamplingParams",
           "pick_backend", "sample_next"]
