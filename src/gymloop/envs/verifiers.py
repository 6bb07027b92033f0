"""verifiers environments, unchanged (the v0 API most Prime Intellect Environments Hub
environments are written for): `load_environment(env_id, **args)` runs in verifiers' runtime
(`gymloop envs install verifiers --with YOUR_ENV`, its own venv), in a bridge process
(verifiers_bridge.py); its dataset gives the tasks and its own Rubric scores gymloop's episodes.

    env: {name: verifiers, options: {env: vf-reverse, args: {n: 20}}}

Tasks: the dataset's rows are training tasks, the eval_dataset's held-out ones (either stands in
for a missing other). The prompt is the row's messages; the reward is the rubric's weighted sum
(clipped to [0, 1]), its functions' values the components. `envs validate` replies with the row's
`answer` (it must score the rubric's best: 1.0) and with a wrong reply (it must score less).
A rubric or bridge that fails is an error, never a reward of 0 (a reward function that raises is
scored 0 by verifiers itself, as in its own rollouts). Single-turn environments for now: a
multi-turn one is refused by name.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import runtimes
from .base import Environment, Score, Task

SPLITS = {"train": "train", "heldout": "eval"}


class VerifiersError(RuntimeError):
    """The verifiers environment or its bridge failed, or did not answer in time."""

    user_facing = True


class VerifiersEnvironment(Environment):
    name = "verifiers"

    def __init__(self, env: str | None = None, args: dict | None = None, path: str | list[str] | None = None,
                 timeout_s: float = 120.0) -> None:
        if not env:
            raise ValueError("verifiers needs option env: the environment's id (its module, e.g. vf-reverse)")
        extra = []
        for p in [path] if isinstance(path, str) else list(path or []):
            extra += ["--path", str(Path(p).resolve())]
        self.bridge = runtimes.Channel("verifiers", Path(__file__).with_name("verifiers_bridge.py"),
                                       [env, json.dumps(args or {}), *extra], timeout_s,
                                       f"the verifiers environment {env!r}", VerifiersError)
        if self.bridge.ready["multi_turn"]:
            self.close()
            raise ValueError(f"verifiers environment {env!r} is multi-turn ({self.bridge.ready['kind']}): gymloop "
                             "runs single-turn verifiers environments so far")
        self.env_id = env
        self.rows = {split: self.bridge.call("rows", split=vsplit)["rows"] for split, vsplit in SPLITS.items()}

    def _task(self, split: str, i: int) -> Task:
        row = self.rows[split][i]
        prompt = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        return Task(id=f"verifiers:{split}:{i}", env=self.name, split=split, source="dataset", answer=row.get("answer"),
                    prompt=tuple({"role": m["role"], "content": m.get("content") or ""} for m in prompt),
                    info={"index": i})

    def sample_tasks(self, n: int, split: str, seed: int) -> list[Task]:
        """`n` rows of the split in an order drawn from `seed` (every row again when `n` is larger)."""
        import random

        rng, out, size = random.Random(seed), [], len(self.rows[split])
        if not size:
            raise ValueError(f"verifiers environment {self.env_id!r} has no {split} rows")
        while len(out) < n:
            out += rng.sample(range(size), size)
        return [self._task(split, i) for i in out[:n]]

    def all_tasks(self) -> list[Task]:
        return [self._task("train", i) for i in range(len(self.rows["train"]))]

    def task_from_id(self, task_id: str) -> Task:
        _, split, i = task_id.split(":")
        return self._task(split, int(i))

    def _score_request(self, task: Task, messages: list[dict]):
        completion = [{"role": m["role"], "content": m["content"]} for m in messages[len(task.prompt):]]
        return self.bridge.send("score", split=SPLITS[task.split], index=task.info["index"], completion=completion)

    def _score(self, fut) -> Score:
        got = self.bridge.result("score", fut)
        reward = float(got["reward"])
        return Score(min(1.0, max(0.0, reward)), {"reward": reward, **{k: float(v) for k, v in got["metrics"].items()}},
                     f"rubric: {reward:g}")

    def verify(self, task: Task, messages: list[dict]) -> Score:
        return self._score(self._score_request(task, messages))

    def verify_batch(self, items: list[tuple[Task, list[dict]]]) -> list[Score]:
        """Every episode sent at once; the bridge scores them concurrently."""
        futs = [self._score_request(t, m) for t, m in items]
        return [self._score(f) for f in futs]

    def gold_reply(self, task: Task) -> str:
        if not task.answer:
            raise NotImplementedError
        return str(task.answer)

    def wrong_turns(self, task: Task) -> list[str] | None:
        return [f"not {task.answer}"[::-1]] if task.answer else None

    def close(self) -> None:
        self.bridge.close()


def make_verifiers(**options) -> VerifiersEnvironment:
    return VerifiersEnvironment(**options)
