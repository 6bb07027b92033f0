"""Fine-tuned models served by id: loaded on demand, several at once within a memory budget,
the least recently used one unloaded when a new one would not fit."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from ..models.chat import ChatTokenizer
from .batcher import Batcher


class ModelPool:
    """`load(path) -> (batcher, tokenizer, bytes)` builds a model's server; `get(id, path)`
    returns it, loading it first if needed."""

    def __init__(self, max_bytes: int, load: Callable[[str], tuple[Batcher, ChatTokenizer, int]]) -> None:
        self.max_bytes, self._load = max_bytes, load
        self._models: "OrderedDict[str, tuple[Batcher, ChatTokenizer, int]]" = OrderedDict()
        self._lock = threading.Lock()
        self.loads = self.unloads = 0

    def get(self, model_id: str, path: str) -> tuple[Batcher, ChatTokenizer]:
        with self._lock:
            if model_id in self._models:
                self._models.move_to_end(model_id)
                b, tok, _ = self._models[model_id]
                return b, tok
            b, tok, size = self._load(path)
            self.loads += 1
            while self._models and sum(s for *_, s in self._models.values()) + size > self.max_bytes:
                _, (old, _, _) = self._models.popitem(last=False)
                old.close()      # its queued requests fail with an error to retry, never hang
                self.unloads += 1
            self._models[model_id] = (b, tok, size)
            return b, tok

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._models)

    def close(self) -> None:
        with self._lock:
            for b, _, _ in self._models.values():
                b.close()
            self._models.clear()
