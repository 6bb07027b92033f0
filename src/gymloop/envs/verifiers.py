"""verifiers environments, unchanged (the v0 API most Prime Intellect Environments Hub
environments are written for): `load_environment(env_id, **args)` runs in verifiers' runtime
(`gymloop envs install verifiers --with YOUR_ENV`, its own venv), in a bridge process
(verifiers_bridge.py); its dataset gives the tasks and its own Rubric scores gymloop's episodes.

    env: {name: verifiers, options: {env: vf-reverse, args: {n: 20}}}

Tasks: the dataset's rows are training tasks, the eval_dataset's held-out ones (either stands in
for a missing other). The prompt is the row's messages.

Every episode is the environment's own `rollout()`, run in the bridge with gymloop answering
each turn it asks for: gymloop's turn goes over as an assistant message, its tool calls
(gymloop's one tool format) as the message's tool calls; a multi-turn environment's
env_response comes back as the next messages (tool results as tool messages); its stop
conditions end the episode. An episode gymloop ends first (max_turns, the context) ends in
verifiers as a truncation. The reward is the rubric's weighted sum on verifiers' own record of
the rollout (clipped to [0, 1]), its functions' and monitors' values the components. `envs
validate` replies with the row's `answer` (it must score the rubric's best: 1.0) and with a
wrong reply (it must score less). A rubric or bridge that fails is an error, never a reward of
0 (a reward function that raises is scored 0 by verifiers itself, as in its own rollouts).
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import runtimes
from ..models.toolcalls import parse_tool_calls
from .base import PeerEnvironment, Score, StepResult, Task, peer

SESSION = "verifiers_session"            # the key of the first message that names its episode's rollout
SPLITS = {"train": "train", "heldout": "eval"}


class VerifiersError(RuntimeError):
    """The verifiers environment or its bridge failed, or did not answer in time."""

    user_facing = True


class VerifiersEnvironment(PeerEnvironment):
    name = "verifiers"

    def __init__(self, env: str | None = None, args: dict | None = None, path: str | list[str] | None = None,
                 timeout_s: float = 120.0) -> None:
        check_verifiers(env, args, path, timeout_s)
        extra = []
        for p in [path] if isinstance(path, str) else list(path or []):
            extra += ["--path", str(Path(p).resolve())]
        self.bridge = runtimes.Channel("verifiers", Path(__file__).with_name("verifiers_bridge.py"),
                                       [env, json.dumps(args or {}), *extra], timeout_s,
                                       f"the verifiers environment {env!r}", VerifiersError)
        self.multi_turn, self.tool_defs = self.bridge.ready["multi_turn"], self.bridge.ready["tool_defs"]
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

    def tools(self, task: Task) -> list[dict] | None:
        """The environment's tools (a row's own `info.tool_defs` first), as chat tools."""
        info = self.rows[task.split][task.info["index"]].get("info")
        defs = (info.get("tool_defs") if isinstance(info, dict) else None) or self.tool_defs
        return [{"type": "function", "function": {k: d[k] for k in ("name", "description", "parameters") if k in d}}
                for d in defs] or None

    def reset(self, task: Task) -> list[dict]:
        messages = [dict(m) for m in task.prompt]
        started = self.bridge.call("start", split=SPLITS[task.split], index=task.info["index"])
        messages[0][SESSION] = started["session"]
        return messages

    def step(self, task: Task, messages: list[dict], assistant_text: str) -> StepResult:
        got = self.bridge.call("turn", session=self._session(messages), **turn(assistant_text, len(messages) - 1))
        return StepResult(observation=tuple(chat_message(m) for m in got["messages"]), done=got["done"])

    def _session(self, messages: list[dict]) -> str:
        sid = messages[0].get(SESSION)
        if sid is None:
            raise VerifiersError("a verifiers episode's messages must start with the ones reset() returned")
        return sid

    def _score_request(self, task: Task, messages: list[dict]):
        turns = [i for i, m in enumerate(messages) if i >= len(task.prompt) and m["role"] == "assistant"]
        last = turn(messages[-1]["content"], len(messages) - 1) if turns and turns[-1] == len(messages) - 1 else None
        return self.bridge.send("finish", session=self._session(messages), turns=len(turns), last=last)

    def _score(self, fut) -> Score:
        got = self.bridge.result("finish", fut)
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


def turn(text: str, index: int) -> dict:
    """gymloop's turn (the message at `index` of its episode) as verifiers gets it: the text,
    and the tool calls in it (gymloop's one tool format) as the message's tool calls."""
    parsed = parse_tool_calls(text)
    return {"content": parsed.text, "tool_calls": [
        {"id": f"call_{index}_{k}", "name": c.name,
         "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)}
        for k, c in enumerate(parsed.calls)]}


def chat_message(m: dict) -> dict:
    """A message verifiers' environment said back, as a chat message (text parts joined)."""
    content = m.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out = {"role": m["role"], "content": content}
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def check_verifiers(env: str | None = None, args: dict | None = None, path: str | list[str] | None = None,
                    timeout_s: float = 120.0) -> None:
    """The options checked without starting anything (a config check; the run starts the bridge)."""
    if not env:
        raise ValueError("verifiers needs option env: the environment's id (its module, e.g. vf-reverse)")
    if args is not None and not isinstance(args, dict):
        raise ValueError(f"verifiers option args must be an object (load_environment's arguments), not {args!r}")
    if not timeout_s > 0:
        raise ValueError(f"verifiers option timeout_s must be > 0, not {timeout_s!r}")


def make_verifiers(**options) -> VerifiersEnvironment:
    return peer(VerifiersEnvironment)(options)
