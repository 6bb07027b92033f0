"""The `graded` environment: prompts of a reinforcement fine-tuning file (OpenAI's format), each
reply scored by a grader (envs/graders.py). It is what a fine-tuning API job of method
`reinforcement` trains on, and works as any environment in `gymloop train`:

    env: {name: graded, options: {path: train.jsonl, heldout_path: valid.jsonl,
                                  grader: {type: python, source: "def grade(sample, item): ..."}}}

A line is {"messages": [... ending with a user or developer turn], "tools"?: [...], <any fields>};
the grader's `item` is the whole line, `sample.output_text` the reply (with `tools`, the line's
schemas are in the prompt and `sample.output_tools` holds the reply's calls, OpenAI's tool calls). A grader that fails (a python grader
that raises, a template naming a missing field) makes the episode an error, excluded from
training, never a reward of 0. Without `heldout_path` the held-out split is the training
prompts themselves (said by `heldout_is_train`).
"""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .base import Environment, Message, Score, Split, Task, json_lines
from .grader_types import Grader, PythonGrader
from .graders import GraderError, Runtime, SandboxPython, grade, sample_of, uses_python, validate


class GradedConfig(BaseModel):
    """The `graded` environment's options."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(None, description="Reinforcement JSONL file: prompts and the fields graders read.")
    rows: list[dict[str, Any]] | None = Field(None, description="The same rows in memory, instead of `path` (a "
                                              "fine-tuning job's, checked when its file was uploaded).")
    grader: Grader = Field(description="The grader (string_check, text_similarity, python, score_model, "
                                   "multi), as the fine-tuning API takes it.")
    heldout_path: str | None = Field(None, description="Held-out prompts (default: the training ones).")
    heldout_rows: list[dict[str, Any]] | None = Field(None, description="Held-out rows in memory, instead of "
                                                      "`heldout_path`.")
    label: str | None = Field(None, description="The environment's name is graded:LABEL (default: the file's stem, or 'rows').")
    timeout_s: float = Field(10.0, gt=0, description="python graders: sandbox wall-clock limit per reply.")
    sandbox_slots: int = Field(2, ge=1, description="python graders: replies graded at once.")

    @field_validator("grader", mode="before")
    @classmethod
    def _valid(cls, g: Any) -> Grader:
        try:
            return validate(g)          # typed, and every part of it checked
        except GraderError as exc:
            raise ValueError(f"grader: {exc}") from None

    @model_validator(mode="after")
    def _one_source(self) -> "GradedConfig":
        if (self.path is None) == (self.rows is None):
            raise ValueError("give the prompts as `path` (a JSONL file) or as `rows`, not both or neither")
        if self.heldout_path is not None and self.heldout_rows is not None:
            raise ValueError("give held-out prompts as `heldout_path` or `heldout_rows`, not both")
        return self

    def train_rows(self) -> list[dict]:
        return self.rows if self.rows is not None else _rows(self.path)

    def heldout(self) -> list[dict] | None:
        """The held-out rows, or None (the training prompts are evaluated)."""
        return self.heldout_rows if self.heldout_rows is not None else (
            _rows(self.heldout_path) if self.heldout_path else None)


def _rows(path: str | Path) -> list[dict]:
    """The file's lines; a bad one is an error naming it (the fine-tuning API checked its files
    on upload with finetune/formats.py; a file given to `gymloop train` is checked here)."""
    rows = []
    for n, row in json_lines(path):
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                      for m in msgs)):
            raise ValueError(f"{path}:{n}: messages must be a non-empty list of {{role, content}} messages")
        if msgs[-1].get("role") not in ("user", "developer"):
            raise ValueError(f"{path}:{n}: the last message must be a user or developer turn")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return rows


def _reply(messages: list[Message]) -> str:
    return messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""


def _sample(task: Task, messages: list[Message]) -> dict:
    """The grader's `sample` of an episode's reply (with `output_tools` when the row offered tools)."""
    return sample_of(_reply(messages), tools=bool(task.info["item"].get("tools")))


def _task(row: dict, n: int, split: Split, name: str) -> Task:
    return Task(id=f"{split}-{n}", env=name, prompt=tuple(dict(m) for m in row["messages"]), answer=None,
                split=split, source="dataset", info={"item": row})


class GradedEnv(Environment):
    """Single-turn prompts, each reply graded (see the module docstring)."""

    def __init__(self, config: GradedConfig, chat=None) -> None:
        self.config = config
        self.name = f"graded:{config.label or (Path(config.path).stem if config.path else 'rows')}"
        train = [_task(r, n, "train", self.name) for n, r in enumerate(config.train_rows())]
        heldout_rows = config.heldout()
        held = ([_task(r, n, "heldout", self.name) for n, r in enumerate(heldout_rows)]
                if heldout_rows is not None else [Task(**{**t.__dict__, "split": "heldout"}) for t in train])
        self.heldout_is_train = heldout_rows is None
        self._tasks = {"train": train, "heldout": held}
        self._by_id = {t.id: t for t in train} | ({t.id: t for t in held} if heldout_rows is not None else {})
        self._python = SandboxPython(config.sandbox_slots, config.timeout_s)
        self._runtime = Runtime(python=self._python, chat=chat)

    def tools(self, task: Task) -> list[dict] | None:
        """The row's `tools` (OpenAI function schemas), rendered into its prompt."""
        return task.info["item"].get("tools") or None

    def tasks(self, split: Split) -> list[Task]:
        return list(self._tasks[split])

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        pool = self._tasks[split]
        if n > len(pool):
            raise ValueError(f"asked for {n} {split} prompts; there are {len(pool)}")
        return random.Random(f"{self.name}|{split}|{seed}").sample(pool, n)

    def draw(self, rng: random.Random, split: Split) -> Task:
        return rng.choice(self._tasks[split])

    def task_from_id(self, task_id: str) -> Task:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise ValueError(f"no prompt {task_id!r} in {self.config.path or self.name}") from None

    def verify(self, task: Task, messages: list[Message]) -> Score:
        try:
            out = grade(self.config.grader, _sample(task, messages), task.info["item"], self._runtime)
        except GraderError as exc:
            return Score(0.0, {}, "grader error", error=f"{exc.kind}: {exc}")
        return Score(out.reward, out.sub_rewards or {"reward": out.reward}, f"graded {out.reward:g}")

    def verify_batch(self, items: list[tuple[Task, list[Message]]]) -> list[Score]:
        g = self.config.grader
        if isinstance(g, PythonGrader):
            # a batch of replies in one sandboxed process per slot (a process start per reply
            # would cost more than generating them)
            values = self._python.many(g.source, [(_sample(t, m), t.info["item"]) for t, m in items])
            return [Score(v, {"reward": v}, f"graded {v:g}") if isinstance(v, float) else
                    Score(0.0, {}, "grader error", error=f"python_grader_runtime_error: {v}") for v in values]
        if not uses_python(g):
            return [self.verify(t, m) for t, m in items]
        # a python grader inside a multi: one sandboxed run per reply, as many at once as slots
        with ThreadPoolExecutor(self.config.sandbox_slots) as ex:
            return list(ex.map(lambda tm: self.verify(*tm), items))

    def close(self) -> None:
        self._python.close()


def make_graded(**options) -> GradedEnv:
    return GradedEnv(GradedConfig(**options))
