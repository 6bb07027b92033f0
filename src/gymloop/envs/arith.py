"""Arithmetic: procedurally generated expressions with a parse-the-answer verifier.

Answer format (what the verifier reads): the **last integer** in the model's reply is its
final answer, so `42`, `17+25=42` and `The answer is 42.` all parse. The `format`
component is 1 only when the reply is exactly one integer (whitespace allowed); the reward
is correctness alone, so a chatty but right model is not punished.
"""
from __future__ import annotations

import random
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .base import Environment, Message, Score, Split, Task, sample_distinct, split_of

_INT = re.compile(r"-?\d+")
_ONLY_INT = re.compile(r"\s*-?\d+\s*")


class ArithConfig(BaseModel):
    """Which expressions the arithmetic environment generates."""

    model_config = ConfigDict(extra="forbid")

    digits: int = Field(2, ge=1, le=6, description="Maximum digits of each operand.")
    ops: str = Field("+", description="Operators to draw from, any of '+-*'.")
    terms: int = Field(2, ge=2, le=5, description="Operands per expression (terms-1 steps).")
    heldout_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share of all problems reserved for held-out evaluation."
    )
    prompt: str = Field("{expr}=", description="The user message; {expr} is replaced by the expression "
                        "(a chat model may want 'What is {expr}? Reply with the number only.').")
    system: str | None = Field(None, description="A system message before it (None: none; a chat "
                               "template may then add its own default).")

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str) -> str:
        if "{expr}" not in v:
            raise ValueError(f"prompt must contain {{expr}}; got {v!r}")
        return v

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: str) -> str:
        if not v or set(v) - set("+-*"):
            raise ValueError(f"ops must be a non-empty string of '+', '-', '*'; got {v!r}")
        return "".join(dict.fromkeys(v))


# Difficulty levels, easiest first.
LEVELS: dict[int, ArithConfig] = {
    1: ArithConfig(digits=1, ops="+-"),
    2: ArithConfig(digits=2, ops="+"),
    3: ArithConfig(digits=2, ops="+-"),
    4: ArithConfig(digits=2, ops="+-*", terms=3),
}


def evaluate(expr: str) -> int:
    """Value of an expression of non-negative ints and + - * with usual precedence."""
    tokens = re.findall(r"\d+|[+\-*]", expr)
    total, term, sign = 0, int(tokens[0]), 1
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            term *= int(num)
        else:
            total += sign * term
            sign, term = (1 if op == "+" else -1), int(num)
    return total + sign * term


def parse_answer(text: str) -> int | None:
    """The last integer in `text`; None if there is none or it is absurdly long (> 40 digits,
    which int() would refuse past 4300 digits anyway)."""
    found = _INT.findall(text[-10_000:])
    if not found or len(found[-1].lstrip("-")) > 40:
        return None
    return int(found[-1])


class ArithEnv(Environment):
    name = "arith"

    def __init__(self, config: ArithConfig | None = None) -> None:
        self.config = config or ArithConfig()

    def _expr(self, rng: random.Random) -> str:
        c = self.config
        hi = 10**c.digits - 1
        parts = [str(rng.randint(0, hi))]
        for _ in range(c.terms - 1):
            parts += [rng.choice(c.ops), str(rng.randint(0, hi))]
        return "".join(parts)

    def space_size(self) -> int:
        c = self.config
        return (10**c.digits) ** c.terms * len(c.ops) ** (c.terms - 1)

    def make_task(self, expr: str) -> Task:
        split = split_of(expr, self.config.heldout_fraction)
        return Task(
            id=f"arith:{expr}", env=self.name,
            prompt=((({"role": "system", "content": self.config.system},) if self.config.system else ())
                    + ({"role": "user", "content": self.config.prompt.replace("{expr}", expr)},)),
            answer=evaluate(expr), split=split,
        )

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        """`n` distinct tasks of `split`, reproducible from `seed`."""
        # seeded by the problem space alone: the same tasks whatever the prompt wording
        rng = random.Random(f"{self.config.model_dump_json(exclude={'prompt', 'system'})}|{split}|{seed}")
        return sample_distinct(self.draw, n, split, rng, self.space_size(), self.config.heldout_fraction)

    def draw(self, rng: random.Random, split: Split) -> Task:
        """One random task of `split` (rejection-sampled on the split hash)."""
        while True:
            expr = self._expr(rng)
            if split_of(expr, self.config.heldout_fraction) == split:
                return self.make_task(expr)

    def task_from_id(self, task_id: str) -> Task:
        expr = task_id.removeprefix("arith:")
        if not re.fullmatch(r"\d+([+\-*]\d+)+", expr):
            raise ValueError(f"not an arith task id: {task_id!r}")
        return self.make_task(expr)

    def verify(self, task: Task, messages: list[Message]) -> Score:
        reply = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        got = parse_answer(reply)
        fmt = 1.0 if _ONLY_INT.fullmatch(reply) else 0.0
        if got is None:
            return Score(0.0, {"format": fmt, "correct": 0.0}, "no integer in the reply")
        correct = float(got == task.answer)
        reason = "correct" if correct else f"expected {task.answer}, got {got}"
        return Score(correct, {"format": fmt, "correct": correct}, reason)

    def gold_reply(self, task: Task) -> str:
        return str(task.answer)

    def wrong_turns(self, task: Task) -> list[str]:
        return [str(task.answer + 1)]


def make_arith(**options) -> ArithEnv:
    return ArithEnv(ArithConfig(**options))
