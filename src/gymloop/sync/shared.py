"""One-copy weight sync to a collector process through shared memory."""
from __future__ import annotations

import torch

from ..engine import Engine
from .tensors import unique_tensors


def _shared_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of a state dict in shared memory; tied names (one tensor) stay one tensor."""
    unique, aliases = unique_tensors(state)
    out = {k: v.detach().clone().share_memory_() for k, v in unique.items()}
    return {k: out[aliases.get(k, k)] for k in state}


class SharedWeights:
    """Two state-dict buffers in shared memory, so cross-process sync costs one copy: the
    trainer writes a new version into the buffer the collector is *not* generating from, and
    the collector re-points its parameters at the newest buffer between batches (no copy).

    One lock orders writes and switches: a reader never sees half of a version, and a writer
    never touches the buffer in use (it always writes the other one).
    """

    def __init__(self, model: torch.nn.Module, ctx) -> None:
        state = model.state_dict()
        self.buffers = [_shared_copy(state), _shared_copy(state)]
        self.version = ctx.Value("q", 0, lock=False)        # newest published version
        self.published = ctx.Value("i", 0, lock=False)      # the buffer that holds it
        self.in_use = ctx.Value("i", -1, lock=False)        # the buffer the reader points at
        self.lock = ctx.Lock()

    def write(self, model: torch.nn.Module, version: int, timeout_s: float = 60.0) -> None:
        if not self.lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"weight sync: could not publish version {version} in {timeout_s:.0f} s")
        try:
            free = 1 - (self.in_use.value if self.in_use.value >= 0 else self.published.value)
            dst = self.buffers[free]
            with torch.no_grad():
                for k, v in unique_tensors(model.state_dict())[0].items():   # a tied tensor once
                    dst[k].copy_(v)
            self.published.value = free
            self.version.value = version
        finally:
            self.lock.release()

    def read_into(self, engine: Engine, timeout_s: float = 60.0) -> None:
        """Point the engine's parameters at the newest version (no bytes copied)."""
        if not self.lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"weight sync: could not read weights in {timeout_s:.0f} s")
        try:
            b = self.published.value
            engine.bind_weights(self.buffers[b], version=self.version.value)
            self.in_use.value = b
        finally:
            self.lock.release()
