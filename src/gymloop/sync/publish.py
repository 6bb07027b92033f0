"""After each optimizer step, who gets the new weights and how: one interface, `WeightSync`,
for the two places a trainer's weights can live.

The transports to the rollout engines are the sources' own `publish` (in-process: nothing
copied; collector thread: a snapshot; collector process: shared memory, `shared.py`; Ray
workers: object-store buckets, `buckets.py`). A `WeightSync` decides what to hand them.
"""
from __future__ import annotations

from typing import Protocol

import torch

from ..engine import Engine


class WeightSync(Protocol):
    def publish(self, version: int) -> None:
        """After optimizer step `version`: the driver's engine and the rollout source generate
        from the new weights next."""

    def finish(self, version: int) -> None:
        """After the last step: the driver's model and engine hold the trainer's last weights
        (they are evaluated and checkpointed)."""


class InProcessSync:
    """The trainer updates `model` in this process: the driver's engine shares its tensors (a
    version bump, no copy) and the source gets the model to copy in its own way."""

    def __init__(self, model: torch.nn.Module, engine: Engine, source) -> None:
        self.model, self.engine, self.source = model, engine, source

    def publish(self, version: int) -> None:
        # a synchronous source generates with the driver's engine and updates it itself
        if getattr(self.source, "engine", None) is not self.engine:
            self.engine.load_weights(self.model.state_dict(), version=version)
        self.source.publish(self.model, version)

    def finish(self, version: int) -> None:
        pass                               # `model` already is the trainer's


class TrainerActorSync:
    """The weights live in trainer actors (`cluster.trainers`): rank 0 puts them in the object
    store and the source passes references on; the driver copies them back once, at the end."""

    def __init__(self, trainer, engine: Engine, source) -> None:
        self.trainer, self.engine, self.source = trainer, engine, source

    def publish(self, version: int) -> None:
        self.source.set_weights(self.trainer.publish(version))

    def finish(self, version: int) -> None:
        self.engine.load_weights(self.trainer.state_dict(), version=version)


def weight_sync(model: torch.nn.Module, trainer, engine: Engine, source, remote_trainer: bool) -> WeightSync:
    """The sync for a trainer in this process or in actors."""
    return TrainerActorSync(trainer, engine, source) if remote_trainer else InProcessSync(model, engine, source)
