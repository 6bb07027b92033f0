"""A run directory: resolved config, metrics as JSON lines, checkpoint, summary.json."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import yaml
from pydantic import BaseModel

from ..config import LoggingConfig
from .loggers import make_sinks, scalars


def new_run_path(parent: str | Path, name: str) -> Path:
    """A new directory `parent/name-<UTC time>[-n]`, created here: mkdir itself decides, so two
    runs started in the same second (two processes included) never share one."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    Path(parent).mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = Path(parent) / (f"{name}-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


class RunDir:
    def __init__(self, parent: str | Path, name: str, config: BaseModel,
                 logging: LoggingConfig | None = None) -> None:
        path = new_run_path(parent, name)
        self.path = path
        (path / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        self._metrics = open(path / "metrics.jsonl", "a", buffering=1)
        self._sinks = make_sinks(logging, path, config.model_dump(mode="json")) if logging else []

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint"

    def log(self, kind: str, **fields) -> None:
        """Append one metrics record (flushed per line, so a crash loses at most one)."""
        self._metrics.write(json.dumps({"kind": kind, "time": time.time(), **fields}) + "\n")
        for sink in self._sinks:
            sink.log(kind, int(fields.get("step", 0)), scalars(fields))

    def write_summary(self, summary: dict) -> Path:
        return write_json(self.path / "summary.json", summary)

    def close(self) -> None:
        self._metrics.close()
        for sink in self._sinks:
            sink.close()


def read_metrics(run_dir: str | Path, kind: str | None = None) -> list[dict]:
    """The records of a run's metrics.jsonl, in order (only those of `kind`: "train", "eval"). A
    last line cut short by a crash is skipped."""
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or rec.get("kind") == kind:
            out.append(rec)
    return out


def write_json(path: Path, data: dict) -> Path:
    """Write atomically: a reader (or a crash) sees the old file or the new one, never half."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return path


class Phases:
    """Wall seconds per named phase (generation, verification, training, evaluation, ...)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)
