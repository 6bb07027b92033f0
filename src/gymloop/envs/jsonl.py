"""Tasks from JSONL files, and the `jsonl` environment that trains on such a file.

One task per line; a bad line is reported with its number and skipped, and every good line
still loads (`gymloop envs load FILE` checks a file).

Line format: {"id": str, "env": str, "prompt": str | [messages], "answer": any,
              "split": "train"|"heldout" (default train), "source": ..., "info": {...}}

The `jsonl` environment (`env: {name: jsonl, options: {path: FILE, checker: last_int}}`) scores
the final reply with a named checker, one small function each (CHECKERS):
- `exact`: the reply, stripped, equals str(answer);
- `last_int`: the last integer of the reply equals the answer;
- `regex`: the answer is a regular expression the reply must contain;
- `python`: `grade(sample, item) -> float` in [0, 1] from the file `grader`, run in gymloop's
  sandbox (never in this process), with sample = {"output_text": reply} and item = the task's
  info plus "answer". A grader that fails or returns something else is an error, not reward 0.
"""
from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import Environment, Message, Score, Split, Task
from .graders import GraderError, SandboxPython

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


class JsonlConfig(BaseModel):
    """The `jsonl` environment: a task file and how to check a reply."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="JSONL task file (the format `gymloop envs load` checks).")
    checker: Literal["exact", "last_int", "regex", "python"] = Field("exact", description="How a reply is scored.")
    grader: str | None = Field(None, description="checker python: a Python file defining grade(sample, item).")
    timeout_s: float = Field(5.0, gt=0, description="checker python: sandbox wall-clock limit per reply.")

    @model_validator(mode="after")
    def _grader(self) -> "JsonlConfig":
        if (self.checker == "python") != (self.grader is not None):
            raise ValueError("checker python needs grader: FILE (and only it takes one)")
        return self


def _reply(messages: list[Message]) -> str:
    return messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""


def check_exact(reply: str, answer: object) -> Score:
    ok = float(reply.strip() == str(answer).strip())
    return Score(ok, {"correct": ok}, "exact match" if ok else f"expected {str(answer)!r}")


def check_last_int(reply: str, answer: object) -> Score:
    from .arith import parse_answer

    got = parse_answer(reply)
    try:
        want = int(answer)   # type: ignore[arg-type]
    except (TypeError, ValueError):
        return Score(0.0, {}, "answer is not an integer", error=f"answer {answer!r} is not an integer")
    ok = float(got == want)
    return Score(ok, {"correct": ok}, "correct" if ok else f"expected {want}, got {got}")


def check_regex(reply: str, answer: object) -> Score:
    try:
        ok = float(re.search(str(answer), reply) is not None)
    except re.error as exc:
        return Score(0.0, {}, "bad pattern", error=f"answer {answer!r} is not a regular expression: {exc}")
    return Score(ok, {"correct": ok}, "matched" if ok else f"no match for {str(answer)!r}")


CHECKERS: dict[str, Callable[[str, object], Score]] = {
    "exact": check_exact, "last_int": check_last_int, "regex": check_regex}

class JsonlEnv(Environment):
    """Single-turn tasks from a file, scored by a named checker (see the module docstring)."""

    def __init__(self, config: JsonlConfig) -> None:
        self.config = config
        tasks, errors = load_tasks(config.path)
        if errors:
            raise ValueError(f"{config.path} has {len(errors)} bad line(s); the first: {errors[0]}")
        if not tasks:
            raise ValueError(f"{config.path} holds no tasks")
        self.name = f"jsonl:{Path(config.path).stem}"
        self._tasks = {t.id: Task(**{**t.__dict__, "env": self.name}) for t in tasks}
        self._grader = Path(config.grader).read_text() if config.grader else None
        self._python = SandboxPython(slots=2, timeout_s=config.timeout_s, memory_mb=512)

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        pool = [t for t in self._tasks.values() if t.split == split]
        if n > len(pool):
            raise ValueError(f"asked for {n} {split} tasks; {self.config.path} has {len(pool)}")
        return random.Random(f"{self.name}|{split}|{seed}").sample(pool, n)

    def draw(self, rng: random.Random, split: Split) -> Task:
        return rng.choice([t for t in self._tasks.values() if t.split == split])

    def task_from_id(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise ValueError(f"no task {task_id!r} in {self.config.path}") from None

    def verify(self, task: Task, messages: list[Message]) -> Score:
        if self._grader is None:
            return CHECKERS[self.config.checker](_reply(messages), task.answer)
        try:
            value = self._python(self._grader, {"output_text": _reply(messages)}, {**task.info, "answer": task.answer})
        except GraderError as exc:
            return Score(0.0, {}, "grader failed", error=str(exc))
        return Score(value, {"grade": value}, f"graded {value:g}")

    def verify_batch(self, items: list[tuple[Task, list[Message]]]) -> list[Score]:
        if self._grader is None:
            return [self.verify(t, m) for t, m in items]
        # one sandboxed run per reply (a grader that hangs on one reply fails only that one),
        # as many at once as the sandbox has slots
        with ThreadPoolExecutor(self._python.slots) as ex:
            return list(ex.map(lambda tm: self.verify(*tm), items))

    def gold_reply(self, task: Task) -> str:
        return str(task.answer)

    def close(self) -> None:
        self._python.close()


def make_jsonl(**options) -> JsonlEnv:
    return JsonlEnv(JsonlConfig(**options))
