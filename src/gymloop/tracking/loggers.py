"""Metric sinks besides `metrics.jsonl` (which is always written): TensorBoard and Weights &
Biases, chosen in the config's `logging`. Each gets every record RunDir.log writes, as
scalars named `<kind>/<field>` (e.g. `train/reward`, `eval/pass1`) at the record's step.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..config import LoggingConfig


class Sink(Protocol):
    def log(self, kind: str, step: int, scalars: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class TensorBoardSink:
    """Event files under RUN_DIR/tensorboard (`tensorboard --logdir runs/`)."""

    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise RuntimeError("logging.tensorboard needs the tensorboard package: "
                               "pip install 'gymloop[loggers]' (or tensorboard)") from exc
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, kind: str, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(f"{kind}/{k}", v, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run in RUN_DIR/wandb; mode "offline" needs no network (`wandb sync` uploads later)."""

    def __init__(self, run_dir: Path, cfg: LoggingConfig, config: dict) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError("logging.wandb needs the wandb package: "
                               "pip install 'gymloop[loggers]' (or wandb)") from exc
        self.run = wandb.init(project=cfg.wandb_project, name=run_dir.name, dir=str(run_dir), config=config,
                              mode=cfg.wandb_mode, settings=wandb.Settings(console="off", silent=True))

    def log(self, kind: str, step: int, scalars: dict[str, float]) -> None:
        self.run.log({f"{kind}/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


def make_sinks(cfg: LoggingConfig, run_dir: Path, config: dict) -> list[Sink]:
    sinks: list[Sink] = []
    if cfg.tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    if cfg.wandb:
        sinks.append(WandbSink(run_dir, cfg, config))
    return sinks


def scalars(fields: dict) -> dict[str, float]:
    """The numeric fields of a record (lists, strings and the step itself are not scalars)."""
    return {k: float(v) for k, v in fields.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
