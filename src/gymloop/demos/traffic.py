"""Simulated production: agents talking to a gymloop server through the official `openai`
client, as a customer's application would, with the environment's verifier as the customer
who says whether the answer was right (POST /v1/feedback with the task reference, so the
loop can rebuild a failure and train on it).

One episode = reset -> chat completion -> env.step (tool results come back as messages) ->
... -> verify. Every completion is a trace in the server's store; the verdict is attached to
the episode's last trace.
"""
from __future__ import annotations

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..envs import Environment, Task
from ..envs.base import run_episode
from ..models.toolcalls import call_text


@dataclass
class TrafficResult:
    episodes: int = 0
    successes: int = 0
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    versions: dict[int, int] = field(default_factory=dict)      # model version -> completions answered

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def send_feedback(base_url: str, api_key: str, trace_id: str, reward: float, task: Task, env: Environment,
                  version: int | None = None) -> None:
    body = {"trace_id": trace_id, "reward": reward,
            "task": {"env": env.name, "version": version, "task_id": task.id}}
    req = urllib.request.Request(base_url + "/v1/feedback", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).close()


def reply_text(message) -> str:
    """An `openai` chat message as the text an environment's verifier reads: calls the server
    parsed into `tool_calls` (leaving no content) go back into gymloop's one tool format."""
    if message.tool_calls:
        return call_text(message.content, [c.model_dump() for c in message.tool_calls])
    return message.content or ""


def api_episode(client, model: str, env: Environment, task: Task, max_tokens: int, max_turns: int,
                temperature: float = 0.0) -> tuple[float, str, list[int], int]:
    """(reward, last trace id, model versions that answered, completion tokens) of one episode
    whose turns the served model writes through the `openai` client."""
    tools = env.tools(task)
    seen = {"trace_id": "", "versions": [], "tokens": 0}

    def reply(messages: list) -> str:
        resp = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=temperature,
            **({"tools": tools} if tools else {}))
        seen["trace_id"] = resp.headers.get("x-gymloop-trace-id", "")
        completion = resp.parse()
        seen["versions"].append(int(resp.headers.get("x-gymloop-model-version", "-1")))
        seen["tokens"] += completion.usage.completion_tokens if completion.usage else 0
        return reply_text(completion.choices[0].message)

    _, score = run_episode(env, task, reply, max_turns)
    return score.reward, seen["trace_id"], seen["versions"], seen["tokens"]


def send_traffic(base_url: str, api_key: str, model: str, env: Environment, tasks: list[Task], *,
                 concurrency: int = 8, max_tokens: int = 16, max_turns: int = 1,
                 env_version: int | None = None) -> TrafficResult:
    """Run one episode per task with `concurrency` clients; each verdict goes back as feedback."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=120)
    out = TrafficResult()
    lock = threading.Lock()

    def one(task: Task) -> None:
        try:
            reward, trace_id, versions, tokens = api_episode(client, model, env, task, max_tokens, max_turns)
            send_feedback(base_url, api_key, trace_id, reward, task, env, env_version)
        except Exception as exc:  # noqa: BLE001 - a failed request is counted and reported, not fatal
            with lock:
                out.errors.append(f"{task.id}: {type(exc).__name__}: {exc}")
            return
        with lock:
            _count(out, reward, versions, tokens)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, tasks))
    return out


def _count(out: TrafficResult, reward: float, versions: list[int], tokens: int) -> None:
    out.episodes += 1
    out.successes += reward >= 1
    out.requests += len(versions)
    out.completion_tokens += tokens
    for v in versions:
        out.versions[v] = out.versions.get(v, 0) + 1
