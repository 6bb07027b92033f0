"""Tasks from JSONL files: one task per line; a bad line is reported with its number and
skipped, and every good line still loads.

Line format: {"id": str, "env": str, "prompt": str | [messages], "answer": any,
              "split": "train"|"heldout" (default train), "source": ..., "info": {...}}
"""
from __future__ import annotations

import json
from pathlib import Path

from .base import Task

REQUIRED = ("id", "env", "prompt")
SOURCES = ("synthetic", "dataset", "production")


def parse_task(obj: object) -> Task:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    unknown = sorted(set(obj) - {*REQUIRED, "answer", "split", "source", "info"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    prompt = obj["prompt"]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not (isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt)):
        raise ValueError("prompt must be a string or a non-empty list of {role, content} messages")
    split = obj.get("split", "train")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be train or heldout, got {split!r}")
    source = obj.get("source", "dataset")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    return Task(id=str(obj["id"]), env=str(obj["env"]), prompt=tuple(prompt), answer=obj.get("answer"),
                split=split, source=source, info=dict(obj.get("info") or {}))


def load_tasks(path: str | Path) -> tuple[list[Task], list[str]]:
    """(tasks, errors); each error names the file and line number."""
    tasks, errors = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                tasks.append(parse_task(json.loads(line)))
            except json.JSONDecodeError as exc:
                errors.append(f"{path}:{n}: not valid JSON ({exc.msg})")
            except ValueError as exc:
                errors.append(f"{path}:{n}: {exc}")
    return tasks, errors
