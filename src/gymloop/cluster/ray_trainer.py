"""The trainer as Ray actors: N data-parallel ranks (torch.distributed: gloo on CPUs, NCCL on
GPUs), each with the model and its optimizer, or 1/N of them with `fsdp` (sharding.py); the
driver routes batches and never holds a gradient.

    group = TrainerGroup(model, trainer_kwargs, cluster_cfg, threads)
    metrics = group.step(batch, PolicyObjective(loss, advantages))  # rows split across the ranks
    source.set_weights(group.publish(version))            # rank 0 puts its buckets in the store
    model.load_state_dict(group.state_dict())             # the weights, back in the driver

Each rank takes every N-th row of the batch and divides its loss by the *global* token count,
and the gradients are summed across ranks (trainer.py), so N ranks take the same optimizer
step as one process on the whole batch. A rank that dies takes its optimizer state with it:
the run stops with an error that says so (resume from a checkpoint), and nothing waits longer
than `step_timeout_s`.
"""
from __future__ import annotations

import copy
import dataclasses
import socket
from datetime import timedelta

import torch

from ..trainer import sharding
from ..engine.device import to_gpu
from ..config import ClusterConfig
from ..trainer.logprobs import TokenBatch
from ..trainer.objectives import PolicyObjective
from ..trainer.state import read_state, write_state
from ..trainer.trainer import Trainer
from ..sync.buckets import unpack
from .ray_backend import ClusterError, Published, put_weights


class TrainerRank:
    """Body of a trainer actor: one data-parallel rank."""

    def __init__(self, model_config, trainer_kwargs: dict, threads: int, layout, *buckets) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_config(model_config).eval()
        self.model.load_state_dict({k: v.clone() for k, v in unpack(list(buckets), layout).items()})
        self.kwargs, self.rank = trainer_kwargs, 0
        self.trainer: Trainer | None = None

    def rendezvous(self) -> str:
        """An address on this rank's node for the process group (rank 0 is asked)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def setup(self, init_method: str | None, rank: int, world: int, timeout_s: float, fsdp: bool,
              gpu: bool = False) -> int:
        """Move to this actor's GPU (Ray sets CUDA_VISIBLE_DEVICES to the one it reserved), join
        the process group (world > 1: NCCL between GPUs, gloo between CPUs), shard the model
        (FSDP), then build the optimizer over the parameters as they now are."""
        if gpu:
            to_gpu(self.model, "cluster.trainer_gpus")
        if world > 1:
            torch.distributed.init_process_group("nccl" if gpu else "gloo", init_method=init_method, rank=rank,
                                                 world_size=world, timeout=timedelta(seconds=timeout_s))
        kwargs = self.kwargs
        if fsdp:
            ref = None
            if kwargs.get("ref_model"):      # copied while whole, then sharded like the model
                ref = copy.deepcopy(self.model)
                sharding.shard(ref, world)
            sharding.shard(self.model, world)
            kwargs = {**kwargs, "ref_model": ref if ref is not None else False}
        self.rank = rank
        self.trainer = Trainer(self.model, **kwargs)
        return rank

    def step(self, batch: TokenBatch, objective: PolicyObjective, kwargs: dict) -> tuple[dict, int]:
        return self.trainer.step(batch, objective, **kwargs), self.trainer.step_count

    def publish(self, version: int, bucket_bytes: int) -> Published | None:
        """Rank 0 puts the weights in the object store. Under FSDP every rank is called, since
        gathering whole tensors is a collective; the others return None."""
        weights = sharding.full_weights(self.model)
        return put_weights(weights, version, bucket_bytes) if self.rank == 0 else None

    def state(self) -> dict | None:
        state = self.trainer.state()
        return state if self.rank == 0 else None

    def set_state(self, state: dict, rng: bool) -> int:
        self.trainer.set_state(state, rng)
        return self.trainer.step_count

    def leave(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def shard_batch(batch: TokenBatch, advantages: torch.Tensor, world: int,
                min_rows: int = 1) -> list[tuple[TokenBatch, torch.Tensor]]:
    """Rank r gets rows r, r+world, ... (so each gets members of every group), cut to its own
    longest sequence. A rank short of `min_rows` (it must run as many minibatches, hence as
    many collectives, as the others) is padded with rows that have no trained token and a zero
    advantage: they add nothing to the loss, the token count or the gradient.

    batch: [N, L]; advantages: [N]. Returns world pairs of ([n_r, L_r], [n_r]).
    """
    out = []
    for r in range(world):
        real = torch.arange(r, len(batch), world)
        rows = torch.cat([real, real.new_zeros(max(0, min_rows - len(real)))])
        part, adv = batch.select(rows), advantages[rows].clone()   # copies: padding edits are local
        pad = torch.arange(len(rows)) >= len(real)
        part.loss_mask[pad] = 0
        adv[pad] = 0
        out.append((part.trim(), adv))
    return out


def merge_metrics(parts: list[dict]) -> dict:
    """The ranks' metrics as the step's: each rank's loss is its share of the global mean, so
    losses add up; ratio_max is the largest; the rest are rank means (grad_norm is the same on
    every rank, after the all-reduce), averaged."""
    out = {}
    for k in parts[0]:
        vals = [p[k] for p in parts]
        out[k] = sum(vals) if k == "loss" else max(vals) if k == "ratio_max" else sum(vals) / len(vals)
    return out


class TrainerGroup:
    """`cfg.trainers` trainer actors behind the Trainer interface used by train.py."""

    def __init__(self, model: torch.nn.Module, trainer_kwargs: dict, cfg: ClusterConfig, threads: int = 1) -> None:
        import ray

        self.cfg, self.world = cfg, cfg.trainers
        actor = ray.remote(num_cpus=cfg.trainer_cpus, num_gpus=cfg.trainer_gpus, max_restarts=0)(TrainerRank)
        _, layout, refs = put_weights(model.state_dict(), 0, cfg.bucket_mb << 20)
        self.ranks = [actor.remote(model.config, trainer_kwargs, threads, layout, *refs) for _ in range(self.world)]
        self.step_count = 0
        # ranks asked to gather whole weights or state: all of them under FSDP (a collective)
        self._gather = self.ranks if cfg.fsdp else self.ranks[:1]
        try:
            init = self._get(self.ranks[0].rendezvous.remote(), "starting the trainer ranks") if self.world > 1 else None
            self._get([a.setup.remote(init, r, self.world, cfg.step_timeout_s, cfg.fsdp, cfg.trainer_gpus > 0)
                       for r, a in enumerate(self.ranks)], "forming the trainers' process group")
        except BaseException:
            self.close()           # on a shared cluster, actors would outlive this driver's error
            raise

    def _get(self, refs, what: str):
        import ray

        try:
            return ray.get(refs, timeout=self.cfg.step_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(f"{what}: the trainer actors did not answer within "
                               f"{self.cfg.step_timeout_s:.0f} s (cluster.step_timeout_s)") from None
        except ray.exceptions.RayActorError as exc:
            raise ClusterError(f"{what}: a trainer actor died, and its optimizer state with it; "
                               f"resume from the last checkpoint (init_trainer_state). {exc}") from None
        except ray.exceptions.RayTaskError as exc:      # e.g. a collective whose peer is gone
            raise ClusterError(f"{what} failed on a trainer actor: {exc.cause!r}") from None

    def step(self, batch: TokenBatch, objective: PolicyObjective, **kwargs) -> dict:
        """Trainer.step on `world` ranks; batch [N, L], the objective's advantages [N] split with its rows."""
        shards = shard_batch(batch, objective.advantages, self.world, kwargs.get("minibatches", 1))
        got = self._get([a.step.remote(b, dataclasses.replace(objective, advantages=adv), kwargs)
                         for a, (b, adv) in zip(self.ranks, shards)], "a training step")
        self.step_count = got[0][1]
        return merge_metrics([m for m, _ in got])

    def publish(self, version: int) -> Published:
        """Rank 0's weights, put in the object store by rank 0 (the driver gets only refs)."""
        return self._get([a.publish.remote(version, self.cfg.bucket_mb << 20) for a in self._gather],
                         "publishing weights")[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights in the driver (for the checkpoint)."""
        _, layout, refs = self.publish(-1)
        return {k: v.clone() for k, v in unpack(self._get(refs, "fetching weights"), layout).items()}

    def save_state(self, path, run: dict | None = None) -> None:
        state = self._get([a.state.remote() for a in self._gather], "fetching the optimizer state")[0]
        write_state(path, {**state, "run": run or {}})

    def load_state(self, path, rng: bool = False) -> dict:
        state = read_state(path)
        self.step_count = self._get([a.set_state.remote(state, rng) for a in self.ranks],
                                    "loading the optimizer state")[0]
        return state["run"]

    def close(self) -> None:
        import ray

        try:
            ray.get([a.leave.remote() for a in self.ranks], timeout=10)
        except Exception:  # noqa: BLE001 - a dead rank has nothing to leave
            pass
        for a in self.ranks:
            ray.kill(a)
        self.ranks = []
