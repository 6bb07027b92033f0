"""The one checkpoint state of every run: beside the model's files (models/checkpoint.save_model),
`train_state.pt` holds what resuming needs and nothing else:

    opt    the optimizer's state (AdamW moments)        sched  the schedule's position
    step   optimizer steps taken                         rng    torch's global RNG
    run    the run's own progress: for `gymloop train` and loop rounds the step and the counters
           of the summary; for a fine-tuning job its step, trained tokens, seconds (and DPO's
           reference log-probs)

Data order is not stored: every run draws it from its seed and step (seeds.py), so a resumed
run draws what an uninterrupted one would. The file is written whole and renamed over the old
one, so a kill -9 while writing leaves the previous state.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

STATE_FILE = "train_state.pt"
LEGACY = ("trainer_state.pt", "trainer.json")       # written before one format: read, never written


def write_state(path: str | Path, state: dict) -> None:
    """`state` (opt, sched, step, rng, run) into checkpoint directory `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{STATE_FILE}.{os.getpid()}.tmp"
    torch.save(state, tmp)
    tmp.replace(path / STATE_FILE)


def has_state(path: str | Path) -> bool:
    path = Path(path)
    return (path / STATE_FILE).exists() or (path / LEGACY[0]).exists()


def read_state(path: str | Path) -> dict:
    """The state written by write_state (run: {} when a checkpoint of an older version had none)."""
    path = Path(path)
    if not (path / STATE_FILE).exists() and (path / LEGACY[0]).exists():
        old = torch.load(path / LEGACY[0], weights_only=True)
        return {**old, "step": json.loads((path / LEGACY[1]).read_text())["step"], "rng": None, "run": {}}
    # weights_only: a state is tensors, numbers, strings, lists and dicts (never arbitrary objects)
    state = torch.load(path / STATE_FILE, weights_only=True)
    return {"rng": None, "run": {}, **state}
