"""`reasoning_gym`: any dataset of the PyPI package `reasoning-gym`, scored by its own
`score_answer`.

The model is asked to end with `Answer: ...`; the text after the last `Answer:` (or, when
there is none, the whole reply) is handed to the dataset's scorer, which may give partial
credit. Train and held-out tasks are split by a hash of the question.
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .base import Environment, Message, Score, Split, Task, split_of

INSTALL = "the reasoning_gym environment needs `pip install reasoning-gym` (or gymloop[gym])"
_ANSWER = re.compile(r"answer\s*:\s*(.*)", re.I | re.S)


class ReasoningGymConfig(BaseModel):
    """Which reasoning-gym dataset, and how many items to draw from it."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field("basic_arithmetic", description="A reasoning-gym dataset name.")
    options: dict[str, Any] = Field(default_factory=dict, description="The dataset's own config options.")
    size: int = Field(2000, ge=10, description="Items generated (both splits together).")
    seed: int = Field(0, description="Seed of the dataset's generator.")
    heldout_fraction: float = Field(0.2, gt=0, lt=1, description="Share of items kept for evaluation.")


def extract(reply: str) -> str:
    found = _ANSWER.findall(reply[-10_000:])
    return (found[-1] if found else reply).strip()


class ReasoningGymEnv(Environment):
    def __init__(self, config: ReasoningGymConfig | None = None) -> None:
        self.config = config or ReasoningGymConfig()
        try:
            import reasoning_gym
        except ModuleNotFoundError:
            raise RuntimeError(INSTALL) from None
        try:
            self.dataset = reasoning_gym.create_dataset(
                self.config.dataset, size=self.config.size, seed=self.config.seed, **self.config.options)
        except Exception as exc:  # noqa: BLE001 - unknown names and bad options, reported clearly
            raise ValueError(f"reasoning-gym dataset {self.config.dataset!r}: {exc}") from None

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"rg:{self.config.dataset}"

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        import random

        tasks = [self._task(i) for i in range(len(self.dataset))]
        pool = [t for t in tasks if t.split == split]
        if n > len(pool):
            raise ValueError(f"asked for {n} {split} tasks; {self.name} has {len(pool)} (raise size)")
        return random.Random(seed).sample(pool, n)

    def _task(self, i: int) -> Task:
        entry = self.dataset[i]
        q = entry["question"]
        prompt = f"{q}\nEnd your reply with 'Answer: <your answer>'."
        return Task(id=f"{self.name}:{i}", env=self.name, prompt=({"role": "user", "content": prompt},),
                    answer=entry["answer"], split=split_of(q, self.config.heldout_fraction),
                    source="dataset", info={"entry": entry})

    def verify(self, task: Task, messages: list[Message]) -> Score:
        reply = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        answer = extract(reply)
        reward = float(self.dataset.score_answer(answer=answer, entry=task.info["entry"]))
        reward = min(1.0, max(0.0, reward))
        return Score(reward, {"correct": float(reward == 1.0), "format": float(bool(_ANSWER.search(reply)))},
                     "correct" if reward == 1.0 else f"expected {task.answer!r}, got {answer[:80]!r}")

    def gold_reply(self, task: Task) -> str:
        return f"Answer: {task.answer}"

    def wrong_turns(self, task: Task) -> list[str]:
        return ["Answer: no idea"]


def make_reasoning_gym(**options) -> ReasoningGymEnv:
    return ReasoningGymEnv(ReasoningGymConfig(**options))
