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

import contextlib
import copy
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..engine import Engine, SamplingParams
from ..engine.factory import EngineSpec, make_engine
from ..sync.shared import SharedWeights
from ..envs.base import Environment, Task
from .episodes import Rollout, RolloutStats, collect


@dataclass
class RolloutBatch:
    step: int
    rollouts: list[Rollout]
    stats: RolloutStats
    dropped_stale: int = 0
    wait_seconds: float = 0.0          # how long the trainer waited for this batch
    versions: list[int] = field(default_factory=list)


TaskSampler = Callable[[int], list[Task]]


def refill_key(step: int, draw: int) -> int:
    """The key a source passes to its task sampler and sampling params for extra draw `draw`
    (>= 1) of step `step` (dynamic sampling): negative, so it never equals a step (>= 1) or
    the evaluation's -1, and distinct per (step, draw < 1000)."""
    if draw < 1 or draw >= 1000:
        raise ValueError(f"refill draw {draw} must be in 1..999")
    return -(step * 1000 + draw)


def _put(out, item, stop) -> None:
    """Queue `item`, waiting while the queue is full, unless told to stop."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def collector_loop(engine: Engine, tok, env: Environment, tasks: TaskSampler, group: int,
                   params: Callable[[int], SamplingParams], max_turns: int, refresh: Callable[[], None],
                   out, stop, engine_lock=contextlib.nullcontext()) -> None:
    """The collector's body, the same in a thread and in a process: take the newest weights
    (`refresh`), generate a step's batch, queue it as ("batch", RolloutBatch); until `stop` is
    set. An exception is queued as ("error", message), never swallowed. `engine_lock` is held
    while the engine is used (an engine the driver evaluates with too)."""
    step = 0
    try:
        while not stop.is_set():
            step += 1
            with engine_lock:
                refresh()
                rollouts, stats = collect(engine, tok, env, tasks(step), group, params(step), max_turns=max_turns)
                version = engine.version
            _put(out, ("batch", RolloutBatch(step, rollouts, stats, versions=[version])), stop)
    except BaseException as exc:  # noqa: BLE001 - handed to the trainer
        _put(out, ("error", f"{type(exc).__name__}: {exc}"), stop)


def next_fresh(get, died: Callable[[], str | None], version: int, max_staleness: int,
               timeout_s: float) -> RolloutBatch:
    """The trainer's side of a collector: the next batch at most `max_staleness` versions older
    than `version` (older ones are dropped and counted). A collector that died or went silent
    for `timeout_s` is an error, never a hang; `died()` says why it is gone, or None."""
    t0 = time.perf_counter()
    dropped = 0
    while True:
        try:
            kind, payload = get(timeout=0.1)
        except queue.Empty:
            why = died()
            if why is not None:
                raise RuntimeError(f"rollout collector died: {why}") from None
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"no rollouts from the collector in {timeout_s:.0f} s") from None
            continue
        if kind == "error":
            raise RuntimeError(f"rollout collector died: {payload}")
        if version - payload.versions[0] > max_staleness:
            dropped += len(payload.rollouts)      # too old to train on: counted, not used
            continue
        payload.dropped_stale = dropped
        payload.wait_seconds = time.perf_counter() - t0
        return payload


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

    def more(self, step: int, draw: int) -> RolloutBatch:
        """Extra rollouts for step `step` (dynamic sampling): other tasks, other seeds."""
        key = refill_key(step, draw)
        rollouts, stats = collect(self.engine, self.tok, self.env, self.tasks(key), self.group,
                                  self.params(key), max_turns=self.max_turns)
        return RolloutBatch(step, rollouts, stats, versions=[self.engine.version])

    def publish(self, model: torch.nn.Module, version: int) -> None:
        self.engine.load_weights(model.state_dict(), version=version)   # shared tensors: no copy

    def close(self) -> None:
        pass


class AsyncSource:
    """Off-policy by at most `max_staleness` versions: a collector thread runs ahead, on its own
    copy of the model, or on an `engine` given (one in its own process, such as vLLM, that the
    driver evaluates with too: `evaluate` waits for the collector's batch and loads the newest
    weights first)."""

    def __init__(self, model: torch.nn.Module, tok, env: Environment, tasks: TaskSampler, group: int,
                 params: Callable[[int], SamplingParams], max_turns: int, max_staleness: int,
                 spec: EngineSpec = EngineSpec(), timeout_s: float = 600.0, engine=None) -> None:
        """spec: the collector's own engine over a copy of the model (unless `engine` is given)."""
        if max_staleness < 1:
            raise ValueError("AsyncSource needs max_staleness >= 1 (0 is the synchronous mode)")
        if engine is None:
            engine = make_engine(spec, copy.deepcopy(model).eval().requires_grad_(False), tok)
        self.engine = engine
        self._engine_lock = threading.Lock()
        self.tok, self.env, self.tasks, self.group = tok, env, tasks, group
        self.params, self.max_turns = params, max_turns
        self.max_staleness, self.timeout_s = max_staleness, timeout_s
        self.version = 0                                   # the trainer's latest published version
        self._queue: queue.Queue = queue.Queue(maxsize=max_staleness)
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=collector_loop, name="rollout-collector", daemon=True,
            args=(self.engine, tok, env, tasks, group, params, max_turns, self._refresh, self._queue, self._stop,
                  self._engine_lock))
        self._thread.start()

    def _refresh(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.engine.load_weights(pending[1], version=pending[0])

    def evaluate(self, tasks: list[Task], n: int, params: SamplingParams) -> tuple[list[Rollout], RolloutStats]:
        """Episodes of `tasks` on the collector's engine with the newest published weights (an
        evaluation's collector: evaluation.evaluate(collector=...))."""
        with self._engine_lock:
            self._refresh()
            return collect(self.engine, self.tok, self.env, tasks, n, params, max_turns=self.max_turns)

    def next(self, step: int) -> RolloutBatch:
        return next_fresh(self._queue.get, lambda: None if self._thread.is_alive() else "its thread exited",
                          self.version, self.max_staleness, self.timeout_s)

    def more(self, step: int, draw: int) -> RolloutBatch:
        """Extra rollouts (dynamic sampling): the collector's next batch."""
        return self.next(step)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with self._lock:
            self._pending = (version, snapshot)
        self.version = version

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _collector_main(engine: Engine, tok, env: Environment, tasks: TaskSampler, group: int,
                    params: Callable[[int], SamplingParams], max_turns: int, weights: SharedWeights,
                    out, stop) -> None:
    """The collector process: one thread, weights from shared memory, the common loop."""
    torch.set_num_threads(1)

    def refresh() -> None:
        if weights.version.value != engine.version:
            weights.read_into(engine)

    collector_loop(engine, tok, env, tasks, group, params, max_turns, refresh, out, stop)


class ProcessSource:
    """Like AsyncSource, but the collector is a separate process (no GIL shared with the
    trainer), fed new weights through shared memory."""

    def __init__(self, model: torch.nn.Module, tok, env: Environment, tasks: TaskSampler, group: int,
                 params: Callable[[int], SamplingParams], max_turns: int, max_staleness: int,
                 spec: EngineSpec = EngineSpec(), timeout_s: float = 600.0) -> None:
        import multiprocessing as mp

        if max_staleness < 1:
            raise ValueError("ProcessSource needs max_staleness >= 1 (0 is the synchronous mode)")
        # fork: the child inherits the model, tokenizer and environment objects as they are
        ctx = mp.get_context("fork")
        self.max_staleness, self.timeout_s = max_staleness, timeout_s
        self.version = 0
        self.weights = SharedWeights(model, ctx)
        engine = make_engine(spec, copy.deepcopy(model).eval().requires_grad_(False), tok)
        self._queue = ctx.Queue(maxsize=max_staleness)
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_collector_main, name="rollout-collector", daemon=True,
                                 args=(engine, tok, env, tasks, group, params, max_turns, self.weights,
                                       self._queue, self._stop))
        self._proc.start()

    def next(self, step: int) -> RolloutBatch:
        return next_fresh(self._queue.get,
                          lambda: None if self._proc.is_alive() else f"exit code {self._proc.exitcode}",
                          self.version, self.max_staleness, self.timeout_s)

    def more(self, step: int, draw: int) -> RolloutBatch:
        """Extra rollouts (dynamic sampling): the collector's next batch."""
        return self.next(step)

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
