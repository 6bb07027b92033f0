"""The Ray backend: rollout workers (an engine and the environment each) as Ray actors,
weights through the object store in buckets. The trainer runs in the driver, or as Ray
actors of its own (cluster.trainers; ray_trainer.py), which then publish the weights.

    source = RaySource(model, tok, env, tasks, group, params, max_turns, cluster_cfg)
    batch = source.next(step)          # the SyncSource contract (sources.py)
    source.publish(model, version)     # one ray.put per bucket, shared by every worker on a node
    source.set_weights(published)      # or weights a trainer actor already put there

Each step's tasks are split across the workers, whole groups together. A worker that dies
mid-step is replaced, loaded with the current weights, and its share is run again; results
are merged only from calls that completed, so no episode is counted twice or half. Nothing
waits forever: a cluster that does not answer fails within `connect_timeout_s`, a step within
`step_timeout_s`, each with a message that says what to do.
"""
from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Callable

import torch

from ..engine.device import to_gpu
from ..config import ClusterConfig
from ..engine import SamplingParams
from ..engine.factory import EngineSpec, make_engine
from ..envs.base import Environment, Task
from ..rollout.episodes import RolloutStats, collect
from ..rollout.sources import RolloutBatch, TaskSampler, refill_key
from ..sync.buckets import Slot, pack, unpack


class ClusterError(RuntimeError):
    """The cluster could not be reached, or its workers could not finish a step."""


def _probe(address: str, timeout_s: float) -> None:
    """Fail fast with a clear message when nothing listens at host:port."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"cluster.address {address!r} is not 'host:port', 'auto' or 'ray://host:port'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(f"no Ray cluster answers at {address} ({exc}); start one with `ray start --head` "
                           "or set cluster.address (null starts a private local instance)") from None


def connect(cfg: ClusterConfig) -> bool:
    """Join (or start) Ray. Returns True when this call started a private instance, which the
    caller then stops."""
    import ray

    if ray.is_initialized():
        return False
    if cfg.address is None:
        ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, logging_level="warning",
                 log_to_driver=False)
        return True
    if cfg.address != "auto":
        _probe(cfg.address, cfg.connect_timeout_s)
    # ray.init itself may retry for minutes; bound it.
    pool = ThreadPoolExecutor(1)
    fut = pool.submit(ray.init, address=cfg.address, logging_level="warning", log_to_driver=False)
    try:
        fut.result(timeout=cfg.connect_timeout_s)
    except FutureTimeout:
        raise ClusterError(f"Ray at {cfg.address} did not accept this driver within {cfg.connect_timeout_s:.0f} s") from None
    except Exception as exc:  # noqa: BLE001 - Ray raises several kinds; all mean "not reachable"
        raise ClusterError(f"could not join the Ray cluster at {cfg.address}: {exc}") from None
    finally:
        pool.shutdown(wait=False)
    return False


# A weight version in the object store: (version, layout, one ref per bucket).
Published = tuple[int, list[Slot], list]


def put_weights(state: dict[str, torch.Tensor], version: int, bucket_bytes: int) -> Published:
    """Pack a state dict into buckets and put each in the object store once; every worker on
    a node then reads the same shared-memory copy. Called by whoever holds the weights (the
    driver, or the rank-0 trainer actor, which then owns the objects)."""
    import ray

    buckets, layout = pack(state, bucket_bytes)
    return version, layout, [ray.put(b) for b in buckets]


class RolloutWorker:
    """Body of a rollout actor: a copy of the model in an engine (gymloop's own, or a vLLM server
    the actor starts from `model_dir`, which its node must see), and the environment."""

    def __init__(self, model_config, tok, env: Environment, spec: EngineSpec, gpu: bool = False) -> None:
        torch.set_num_threads(1)
        self.tok, self.env = tok, env
        model = None
        if spec.backend != "vllm":          # vLLM loads its weights from the model directory itself
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(model_config).eval().requires_grad_(False)
            if gpu:
                to_gpu(model, "cluster.worker_gpus")
        self.engine = make_engine(replace(spec, threads=1), model, tok)

    def load(self, version: int, layout: list[Slot], *buckets) -> int:
        """Load a weight version; `buckets` arrive as read-only views of the object store."""
        self.engine.load_weights(unpack(list(buckets), layout), version=version)
        return version

    def collect(self, tasks: list[Task], group: int, params: SamplingParams, max_turns: int):
        rollouts, stats = collect(self.engine, self.tok, self.env, tasks, group, params, max_turns=max_turns)
        return rollouts, stats, self.engine.version

    def pid(self) -> int:
        return os.getpid()

    def engine_pid(self) -> int | None:
        """The vLLM server's process (None: the engine runs in this actor)."""
        proc = getattr(getattr(self.engine, "server", None), "proc", None)
        return proc.pid if proc is not None else None

    def close(self) -> None:
        """Stop a vLLM server this actor started (before the actor is killed)."""
        self.engine.close()


def merge_stats(parts: list[RolloutStats]) -> RolloutStats:
    """Counts add up; seconds are the slowest worker's, since workers run side by side (the
    trainer's clock saw the longest, not the sum)."""
    return RolloutStats(
        episodes=sum(p.episodes for p in parts), generated_tokens=sum(p.generated_tokens for p in parts),
        prompt_tokens=sum(p.prompt_tokens for p in parts), errors=sum(p.errors for p in parts),
        calls=sum(p.calls for p in parts), segments=sum(p.segments for p in parts),
        overridden=sum(p.overridden for p in parts),
        gen_seconds=max((p.gen_seconds for p in parts), default=0.0),
        env_seconds=max((p.env_seconds for p in parts), default=0.0))


def shard(tasks: list[Task], n: int) -> list[list[Task]]:
    """Contiguous, near-equal shares, so concatenating results keeps the tasks' order."""
    k, extra = divmod(len(tasks), n)
    out, start = [], 0
    for i in range(n):
        end = start + k + (i < extra)
        out.append(tasks[start:end])
        start = end
    return out


class RaySource:
    """Rollouts from Ray actors: synchronous (max_staleness 0) or one step ahead (>= 1)."""

    def __init__(self, model: torch.nn.Module, tok, env: Environment, tasks: TaskSampler, group: int,
                 params: Callable[[int], SamplingParams], max_turns: int, cfg: ClusterConfig,
                 engine: EngineSpec = EngineSpec(), max_staleness: int = 0) -> None:
        import ray

        self.cfg, self.tok, self.env, self.tasks = cfg, tok, env, tasks
        self.max_staleness = max_staleness
        self.group, self.params, self.max_turns, self.spec = group, params, max_turns, engine
        self.model_config = model.config
        self.owns_ray = connect(cfg)
        self._actor = ray.remote(num_cpus=cfg.worker_cpus, num_gpus=cfg.worker_gpus, max_restarts=0)(RolloutWorker)
        self.replaced = 0                       # workers replaced after dying, over the run
        self.publish(model, 0)
        self.workers = [self._spawn() for _ in range(cfg.workers)]
        self._loaded = [-1] * cfg.workers        # weight version each worker was sent
        self._ahead: dict | None = None          # the next step, already queued (asynchronous mode)

    def _spawn(self):
        return self._actor.remote(self.model_config, self.tok, self.env, self.spec, self.cfg.worker_gpus > 0)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """The driver's weights for the workers (the trainer runs in the driver)."""
        self.set_weights(put_weights(model.state_dict(), version, self.cfg.bucket_mb << 20))

    def set_weights(self, weights: "Published") -> None:
        """Weights already in the object store (a trainer actor put them there); each worker
        loads them before its next call."""
        self._weights = weights

    def _submit(self, i: int, tasks: list[Task], params: SamplingParams, group: int):
        version, layout, refs = self._weights
        w = self.workers[i]
        if self._loaded[i] != version:       # calls on one actor run in order: load, then collect
            w.load.remote(version, layout, *refs)
            self._loaded[i] = version
        return w.collect.remote(tasks, group, params, self.max_turns)

    def _launch(self, step: int, tasks: list[Task] | None = None, params: SamplingParams | None = None,
                group: int | None = None) -> dict:
        """Queue a step's episodes (or, given `tasks`, an evaluation's: step -1) on the workers."""
        params = self.params(step) if params is None else params
        group = self.group if group is None else group
        shares = shard(self.tasks(step) if tasks is None else list(tasks), len(self.workers))
        return {"step": step, "label": f"step {step}" if tasks is None else "evaluation",
                "params": params, "shares": shares, "group": group,
                "pending": {self._submit(i, s, params, group): i for i, s in enumerate(shares) if s}}

    def collect(self, tasks: list[Task], group: int, params: SamplingParams) -> tuple[list, RolloutStats]:
        """Episodes of `tasks` on the workers with the latest published weights (the held-out
        evaluation runs here, so the evaluator is the actors, not the driver). Queued after any
        step already in flight; a dead worker is replaced as in training."""
        batch = self._gather(self._launch(-1, tasks, params, group))
        return batch.rollouts, batch.stats

    def next(self, step: int) -> RolloutBatch:
        """Step `step`'s rollouts. With max_staleness >= 1 the next step is queued on the
        workers before this one is gathered, so they generate while the trainer trains; its
        rollouts are then one version old."""
        t0 = time.perf_counter()
        flight = self._ahead if self._ahead and self._ahead["step"] == step else self._launch(step)
        self._ahead = self._launch(step + 1) if self.max_staleness else None
        batch = self._gather(flight)
        batch.wait_seconds = time.perf_counter() - t0
        return batch

    def more(self, step: int, draw: int) -> RolloutBatch:
        """Extra rollouts for step `step` (dynamic sampling), queued after any step in flight;
        the step queued ahead stays queued."""
        return self._gather(self._launch(refill_key(step, draw)))

    def _gather(self, flight: dict) -> RolloutBatch:
        import ray

        step, params, shares, pending = flight["step"], flight["params"], flight["shares"], flight["pending"]
        group, label = flight["group"], flight["label"]
        results: dict[int, tuple] = {}
        deadline = time.monotonic() + self.cfg.step_timeout_s
        restarts = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise ClusterError(f"{label}: rollout workers returned nothing within "
                                   f"{self.cfg.step_timeout_s:.0f} s (cluster.step_timeout_s)")
            i = pending.pop(ready[0])
            try:
                results[i] = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:
                restarts += 1
                if restarts > self.cfg.max_restarts:
                    raise ClusterError(f"{label}: {restarts} rollout workers died "
                                       f"(cluster.max_restarts {self.cfg.max_restarts}); last: {exc}") from None
                self._replace(i)
                pending[self._submit(i, shares[i], params, group)] = i       # its whole share, again
        order = sorted(results)
        rollouts = [r for i in order for r in results[i][0]]
        stats = merge_stats([results[i][1] for i in order])
        versions = sorted({results[i][2] for i in order})
        return RolloutBatch(step, rollouts, stats, versions=versions)

    def _replace(self, i: int) -> None:
        """A new actor in slot i. Work queued on the dead one for the step ahead is queued again."""
        self.replaced += 1
        self.workers[i] = self._spawn()
        self._loaded[i] = -1
        ahead = self._ahead
        if ahead is not None:
            for fut, w in list(ahead["pending"].items()):
                if w == i:
                    del ahead["pending"][fut]
                    ahead["pending"][self._submit(i, ahead["shares"][i], ahead["params"], ahead["group"])] = i

    def close(self) -> None:
        import ray

        try:                                   # workers' vLLM servers stop with them, not after
            ray.get([w.close.remote() for w in self.workers], timeout=60)
        except Exception:  # noqa: BLE001 - a dead worker's server died with it (PR_SET_PDEATHSIG)
            pass
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers = []
        if self.owns_ray:
            ray.shutdown()
