"""Dynamic batching: concurrent requests share engine batches, and weights swap between them.

One thread owns the engine. Requests queue up; the thread takes everything that arrived
within `max_wait_s` of the first (up to `max_batch`), groups it by sampling parameters and
runs one `generate` per group. A new model version is applied only between batches, so a
swap never fails or mixes an in-flight request.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..engine import Engine, Generation, SamplingParams


class BatcherStopped(RuntimeError):
    """The batcher stopped before this request ran."""


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: Future = field(default_factory=Future)
    on_token: Callable[[int], None] | None = None    # streaming: called with each token id
    version: int = -1                                  # the model version that answered


class Batcher:
    def __init__(self, engine: Engine, max_batch: int = 64, max_wait_s: float = 0.005,
                 on_batch: Callable[[float, int, int], None] | None = None,
                 full: Callable[[int], bool] | None = None) -> None:
        self.engine = engine
        self.on_batch = on_batch      # (seconds, prompt_tokens, generated_tokens) per engine batch
        # full(n): a batch of n requests need not wait for more (every client that could send one
        # has: an agent gateway's open episodes), so it runs before max_wait_s is up
        self.full = full
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self._queue: "queue.Queue[Request]" = queue.Queue()
        self._swap: tuple[dict[str, torch.Tensor], int, Future] | None = None
        self._swap_lock = threading.Lock()
        self._stop = threading.Event()
        self.batches = 0
        self.batched_requests = 0
        self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               on_token: Callable[[int], None] | None = None) -> Request:
        if self._stop.is_set():
            raise RuntimeError("the batcher is stopped")
        req = Request(prompt_ids, params, on_token=on_token)
        self._queue.put(req)
        return req

    def swap(self, weights: dict[str, torch.Tensor], version: int) -> Future:
        """Load `weights` as `version` between batches; the future resolves once in service."""
        fut: Future = Future()
        with self._swap_lock:
            if self._swap is not None:
                self._swap[2].cancel()
            self._swap = (weights, version, fut)
        self._queue.put(None)  # type: ignore[arg-type]  # wake the loop
        return fut

    def _apply_swap(self) -> None:
        with self._swap_lock:
            pending, self._swap = self._swap, None
        if pending is not None:
            weights, version, fut = pending
            try:
                self.engine.load_weights(weights, version=version)
                fut.set_result(version)
            except BaseException as exc:  # noqa: BLE001 - reported to whoever asked for the swap
                fut.set_exception(exc)

    def _collect(self) -> list[Request]:
        first = self._queue.get()
        batch = [first] if first is not None else []
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch and not (self.full is not None and self.full(len(batch))):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                req = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if req is not None:
                batch.append(req)
        return batch

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._collect()
            self._apply_swap()
            groups: dict[SamplingParams, list[Request]] = {}
            for r in batch:
                groups.setdefault(r.params, []).append(r)
            for params, reqs in groups.items():
                self._run(params, reqs)
        # stopped: whatever still waits gets an error (to retry elsewhere), never a hang
        while True:
            try:
                req = self._queue.get_nowait()
            except queue.Empty:
                break
            if req is not None and not req.future.done():
                req.future.set_exception(BatcherStopped("the model was unloaded or the server is stopping; retry"))

    def _run(self, params: SamplingParams, reqs: list[Request]) -> None:
        def on_token(i: int, tok: int) -> None:
            cb = reqs[i].on_token
            if cb is not None:
                cb(tok)

        try:
            out = self.engine.generate([r.prompt_ids for r in reqs], params,
                                       on_token=on_token if any(r.on_token for r in reqs) else None)
        except BaseException as exc:  # noqa: BLE001 - every waiting request gets the error
            for r in reqs:
                r.future.set_exception(exc)
            return
        self.batches += 1
        self.batched_requests += len(reqs)
        if self.on_batch is not None:
            self.on_batch(out.seconds, out.prompt_tokens, out.generated_tokens)
        for r, g in zip(reqs, out.generations):
            r.version = out.version
            r.future.set_result(g)

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)  # type: ignore[arg-type]
        self._thread.join(timeout=10)


__all__ = ["Batcher", "BatcherStopped", "Generation", "Request"]
