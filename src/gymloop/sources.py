"""Where the trainer's rollouts come from: synchronously, or from a collector (a process, or
a thread) that generates the next batch while the trainer trains on this one (asynchronous RL).

All give `next(step) -> RolloutBatch` and `publish(model, version)`. An asynchronous
collector runs its own copy of the weights; `publish` hands it the new ones (shared memory
for a process, a snapshot for a thread), which it loads between batches, so a rollout may be
up to `max_staleness` versions old. Older ones are
dropped and counted. The loss needs no extra term for the mismatch: its PPO ratio is taken
against the behaviour log-probs the rollout carries (the importance weight of the sampled
tokens), and clipping truncates it.

A collector that dies or stalls does not leave the trainer waiting: `next` raises after
`timeout_s` with the collector's own error.
"""
from __future__ import annotations

import copy
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .engine import Engine, SamplingParams
from .envs.base import Environment, Task
from .rollout import Rollout, RolloutStats, collect


@dataclass
class RolloutBatch:
    step: int
    rollouts: list[Rollout]
    stats: RolloutStats
    dropped_stale: int = 0
    wait_seconds: float = 0.0          # how long the trainer waited for this batch
    versions: list[int] = field(default_factory=list)


TaskSampler = Callable[[int], list[Task]]


class SyncSource:
    """On-policy: generate with the trainer's own model (shared tensors, nothing copied)."""

    def __init__(self, engine: Engine, tok, env: Environment, tasks: TaskSampler, group: int,
                 params: Callable[[int], SamplingParams], max_turns: int) -> None:
        self.engine, self.tok, self.env, self.tasks = engine, tok, env, tasks
        self.group, self.params, self.max_turns = group, params, max_turns

    def next(self, step: int) -> RolloutBatch:
        rollouts, stats = collect(self.engine, self.tok, self.env, self.tasks(step), self.group,
                                  self.params(step), max_turns=self.max_turns)
        return RolloutBatch(step, rollouts, stats, versions=[self.engine.version])

    def publish(self, model: torch.nn.Module, version: int) -> None:
        self.engine.load_weights(model.state_dict(), version=version)   # shared tensors: no copy

    def close(self) -> None:
        pass


class AsyncSource:
    """Off-policy by at most `max_staleness` versions: a collector thread runs ahead."""

    def __init__(self, model: torch.nn.Module, tok, env: Environment, tasks: TaskSampler, group: int,
                 params: Callable[[int], SamplingParams], max_turns: int, max_staleness: int,
                 backend: str = "auto", timeout_s: float = 600.0) -> None:
        if max_staleness < 1:
            raise ValueError("AsyncSource needs max_staleness >= 1 (0 is the synchronous mode)")
        gen_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.engine = Engine(gen_model, tok.pad_token_id, backend=backend, decode=tok.decode)
        self.tok, self.env, self.tasks, self.group = tok, env, tasks, group
        self.params, self.max_turns = params, max_turns
        self.max_staleness, self.timeout_s = max_staleness, timeout_s
        self.version = 0                                   # the trainer's latest published version
        self._queue: "queue.Queue[RolloutBatch]" = queue.Queue(maxsize=max_staleness)
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rollout-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        step = 0
        try:
            while not self._stop.is_set():
                step += 1
                with self._lock:
                    pending, self._pending = self._pending, None
                if pending is not None:
                    self.engine.load_weights(pending[1], version=pending[0])
                rollouts, stats = collect(self.engine, self.tok, self.env, self.tasks(step), self.group,
                                          self.params(step), max_turns=self.max_turns)
                batch = RolloutBatch(step, rollouts, stats, versions=[self.engine.version])
                while not self._stop.is_set():
                    try:
                        self._queue.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, never swallowed
            self._error = exc

    def next(self, step: int) -> RolloutBatch:
        t0 = time.perf_counter()
        dropped = 0
        while True:
            try:
                batch = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._error is not None or not self._thread.is_alive():
                    raise RuntimeError(f"rollout collector died: {self._error!r}") from self._error
                if time.perf_counter() - t0 > self.timeout_s:
                    raise TimeoutError(f"no rollouts from the collector in {self.timeout_s:.0f} s")
                continue
            if self.version - batch.versions[0] > self.max_staleness:
                dropped += len(batch.rollouts)      # too old to train on: counted, not used
                continue
            batch.dropped_stale = dropped
            batch.wait_seconds = time.perf_counter() - t0
            return batch

    def publish(self, model: torch.nn.Module, version: int) -> None:
        snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with self._lock:
            self._pending = (version, snapshot)
        self.version = version

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _shared_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of a state dict in shared memory; tied names (one tensor) stay one tensor."""
    by_ptr: dict[tuple, torch.Tensor] = {}
    out = {}
    for k, v in state.items():
        key = (v.data_ptr(), tuple(v.shape), v.dtype)
        if key not in by_ptr:
            by_ptr[key] = v.detach().clone().share_memory_()
        out[k] = by_ptr[key]
    return out


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
            dst, done = self.buffers[free], set()
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    if dst[k].data_ptr() not in done:       # a tied tensor is copied once
                        dst[k].copy_(v)
                        done.add(dst[k].data_ptr())
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


def _collector_main(engine: Engine, tok, env: Environment, tasks: TaskSampler, group: int,
                    params: Callable[[int], SamplingParams], max_turns: int, weights: SharedWeights,
                    out, stop) -> None:
    """Body of the collector process: generate batches until told to stop."""
    torch.set_num_threads(1)
    step = 0
    try:
        while not stop.is_set():
            step += 1
            if weights.version.value != engine.version:
                weights.read_into(engine)
            rollouts, stats = collect(engine, tok, env, tasks(step), group, params(step), max_turns=max_turns)
            batch = RolloutBatch(step, rollouts, stats, versions=[engine.version])
            while not stop.is_set():
                try:
                    out.put(("batch", batch), timeout=0.1)
                    break
                except queue.Full:
                    continue
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer, never swallowed
        out.put(("error", f"{type(exc).__name__}: {exc}"))


class ProcessSource:
    """Like AsyncSource, but the collector is a separate process (no GIL shared with the
    trainer), fed new weights through shared memory."""

    def __init__(self, model: torch.nn.Module, tok, env: Environment, tasks: TaskSampler, group: int,
                 params: Callable[[int], SamplingParams], max_turns: int, max_staleness: int,
                 backend: str = "auto", timeout_s: float = 600.0) -> None:
        import multiprocessing as mp

        if max_staleness < 1:
            raise ValueError("ProcessSource needs max_staleness >= 1 (0 is the synchronous mode)")
        # fork: the child inherits the model, tokenizer and environment objects as they are
        ctx = mp.get_context("fork")
        self.max_staleness, self.timeout_s = max_staleness, timeout_s
        self.version = 0
        self.weights = SharedWeights(model, ctx)
        gen_model = copy.deepcopy(model).eval().requires_grad_(False)
        engine = Engine(gen_model, tok.pad_token_id, backend=backend, decode=tok.decode)
        self._queue = ctx.Queue(maxsize=max_staleness)
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_collector_main, name="rollout-collector", daemon=True,
                                 args=(engine, tok, env, tasks, group, params, max_turns, self.weights,
                                       self._queue, self._stop))
        self._proc.start()

    def next(self, step: int) -> RolloutBatch:
        t0 = time.perf_counter()
        dropped = 0
        while True:
            try:
                kind, payload = self._queue.get(timeout=0.1)
            except queue.Empty:
                if not self._proc.is_alive():
                    raise RuntimeError(f"rollout collector died (exit code {self._proc.exitcode})") from None
                if time.perf_counter() - t0 > self.timeout_s:
                    raise TimeoutError(f"no rollouts from the collector in {self.timeout_s:.0f} s") from None
                continue
            if kind == "error":
                raise RuntimeError(f"rollout collector died: {payload}")
            batch = payload
            if self.version - batch.versions[0] > self.max_staleness:
                dropped += len(batch.rollouts)
                continue
            batch.dropped_stale = dropped
            batch.wait_seconds = time.perf_counter() - t0
            return batch

    def publish(self, model: torch.nn.Module, version: int) -> None:
        self.weights.write(model, version)
        self.version = version

    def close(self) -> None:
        self._stop.set()
        # drain so the child is not blocked on a full queue, then wait for it
        end = time.monotonic() + 10
        while self._proc.is_alive() and time.monotonic() < end:
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(timeout=5)
