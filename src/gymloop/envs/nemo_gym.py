"""NeMo Gym resources servers, unchanged: the server class (`server: module:Class`, e.g. one of the
examples inside the nemo-gym wheel) runs standalone in NeMo Gym's runtime (`gymloop envs install
nemo-gym`, its own venv) with its own code and data, or is reached at `url`; gymloop is the agent.

    env: {name: nemo_gym, options: {server: "resources_servers.example_multi_step.app:ExampleMultiStepResourcesServer"}}

An episode, as NeMo Gym's agents run one: `POST /seed_session` (a session cookie per episode) ->
the row's `responses_create_params` (its input as the messages, its tools as gymloop's tools) ->
each tool call the model makes in gymloop's one tool format is `POST /<tool>` with its arguments,
answered as a tool message -> a reply without a call ends it -> `POST /verify` with the row and
the episode as a Responses API object. The reward is the server's, mapped from `reward_range`
onto [0, 1]; the verify answer's other numbers are its components. A server that fails or does
not answer is an error, never a reward 0.
"""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx

from .. import runtimes
from ..models.toolcalls import parse_tool_calls, tool_response
from .base import PeerEnvironment, Score, StepResult, Task, check_reward_range, peer, split_of, unit_reward

SESSION = "nemo_gym_session"
# fields of a verify answer that are the request echoed back, not measurements
ECHOED = {"responses_create_params", "response", "reward"}


class NemoGymError(RuntimeError):
    """The resources server failed, refused, or did not answer in time."""

    user_facing = True


def chat_messages(items: list[dict]) -> list[dict]:
    """Responses API input items as chat messages (developer -> system; text parts joined)."""
    out = []
    for item in items:
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append({"role": "system" if item.get("role") == "developer" else item.get("role", "user"),
                    "content": content or ""})
    return out


def chat_tools(tools: list[dict]) -> list[dict]:
    """Responses API function tools as chat completions' (`{"type": "function", "function": {...}}`)."""
    return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            for t in tools if t.get("type", "function") == "function"]


def measurements(verified: dict, row: dict) -> dict[str, float]:
    """The numbers of a verify answer besides its reward (what it did not echo from the row),
    a nested dict of them (e.g. `reward_components`) flattened into its keys."""
    out = {}
    for k, v in verified.items():
        if k in ECHOED or k in row:
            continue
        if isinstance(v, dict):
            out.update({kk: float(vv) for kk, vv in v.items() if isinstance(vv, (int, float)) and kk not in verified})
        elif isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def call_id(message_index: int, k: int) -> str:
    """The id of the k-th call of the assistant message at `message_index` of its episode."""
    return f"call_{message_index}_{k}"


def response_of(messages: list[dict], start: int, tools: list[dict]) -> dict:
    """The episode's turns (messages[start:]) as a Responses API response: each call a
    `function_call` item and its result a `function_call_output`, each text reply a `message`."""
    output = []
    for i, m in enumerate(messages[start:], start):
        if m["role"] == "assistant":
            parsed = parse_tool_calls(m["content"])
            if parsed.text:
                output.append({"id": f"msg_{uuid.uuid4().hex[:16]}", "type": "message", "role": "assistant",
                               "status": "completed", "content": [{"type": "output_text", "text": parsed.text,
                                                                    "annotations": []}]})
            for k, c in enumerate(parsed.calls):
                args = c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)
                output.append({"id": f"fc_{uuid.uuid4().hex[:16]}", "type": "function_call", "status": "completed",
                               "call_id": call_id(i, k), "name": c.name, "arguments": args})
        elif m["role"] == "tool":
            output.append({"type": "function_call_output", "call_id": m.get("tool_call_id", ""),
                           "output": m["content"]})
    return {"id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response", "created_at": int(time.time()),
            "model": "gymloop", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": tools, "status": "completed"}


class NemoGymEnvironment(PeerEnvironment):
    name = "nemo_gym"

    def __init__(self, server: str | None = None, url: str | None = None, data: str | None = None,
                 reward_range: tuple[float, float] = (0.0, 1.0), timeout_s: float = 60.0,
                 heldout_fraction: float = 0.2) -> None:
        """reward_range: the scale of the server's reward, mapped onto [0, 1] (e.g. [0, 3] for a
        reward that sums three components)."""
        check_nemo_gym(server, url, data, reward_range)
        self.reward_range = check_reward_range(reward_range, "nemo_gym")
        self.process = None
        if server is not None:
            try:
                self.process = runtimes.Process("nemo-gym", Path(__file__).with_name("nemo_gym_server.py"), [server])
            except runtimes.RuntimeMissing:
                raise
            except RuntimeError as exc:
                raise NemoGymError(f"the NeMo Gym server did not start ({server}): {exc}") from None
            url, data = self.process.ready["url"], data or self.process.ready["data"]
        if data is None:
            self.close()
            raise ValueError("nemo_gym needs option data (a JSONL of rows) when the server has no example data")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()]
        self.tasks = [Task(id=f"nemo_gym:{i}", env=self.name, prompt=tuple(chat_messages(
            r["responses_create_params"]["input"])), answer=None,
            split=split_of(json.dumps(r["responses_create_params"]["input"], sort_keys=True), heldout_fraction),
            source="dataset", info={"row": i}) for i, r in enumerate(self.rows)]
        self._sessions: dict[str, httpx.Client] = {}

    def _send(self, client: httpx.Client, path: str, body: dict) -> httpx.Response:
        try:
            return client.post(path, json=body)
        except httpx.HTTPError as exc:
            why = self.process.died() if self.process is not None else None
            raise NemoGymError(f"the NeMo Gym server did not answer {path}: {exc}" + (f"\n{why}" if why else "")) from None

    def _post(self, client: httpx.Client, path: str, body: dict) -> dict:
        r = self._send(client, path, body)
        if r.status_code != 200:
            raise NemoGymError(f"the NeMo Gym server answered {path} with {r.status_code}: {r.text[:1000]}")
        return r.json()

    def sample_tasks(self, n: int, split: str, seed: int) -> list[Task]:
        """`n` rows of `split` in an order drawn from `seed`; with fewer rows than `n`, every row
        again in a new order, as often as it takes (a data file of a few rows)."""
        import random

        pool = [t for t in self.tasks if t.split == split]
        if not pool:
            raise ValueError(f"nemo_gym: none of the data's {len(self.tasks)} rows is in the {split} split")
        rng, out = random.Random(seed), []
        while len(out) < n:
            out += rng.sample(pool, len(pool))
        return out[:n]

    def all_tasks(self) -> list[Task]:
        return list(self.tasks)

    def task_from_id(self, task_id: str) -> Task:
        return self.tasks[int(task_id.removeprefix("nemo_gym:"))]

    def row(self, task: Task) -> dict:
        return self.rows[task.info["row"]]

    def tools(self, task: Task) -> list[dict] | None:
        return chat_tools(self.row(task)["responses_create_params"].get("tools", [])) or None

    def reset(self, task: Task) -> list[dict]:
        sid = uuid.uuid4().hex
        client = httpx.Client(base_url=self.url, timeout=self.timeout_s)        # its cookies: the session
        self._sessions[sid] = client
        self._post(client, "/seed_session", self.row(task))     # the whole row, as NeMo Gym's agents seed it
        messages = [dict(m) for m in task.prompt]
        messages[0][SESSION] = sid
        return messages

    def _client(self, messages: list[dict]) -> tuple[str, httpx.Client]:
        sid = next((m[SESSION] for m in messages if SESSION in m), None)
        if sid not in self._sessions:
            raise NemoGymError("a nemo_gym episode's messages must start with the ones reset() returned")
        return sid, self._sessions[sid]

    def step(self, task: Task, messages: list[dict], assistant_text: str) -> StepResult:
        _, client = self._client(messages)
        parsed = parse_tool_calls(assistant_text)
        if not parsed.calls:
            return StepResult(observation=(), done=True)
        names = {t["function"]["name"] for t in self.tools(task) or []}
        results = []
        for k, c in enumerate(parsed.calls):
            if c.name not in names or not isinstance(c.arguments, dict):
                content = tool_response({"error": f"no tool {c.name!r}" if c.name not in names else "bad arguments"})
            else:
                # whatever the route answers, an HTTP error too, is the tool's output, as in NeMo Gym's
                # own agent (a server may offer a tool it has no route for: a call is the answer)
                content = self._send(client, f"/{c.name}", c.arguments).text
            results.append({"role": "tool", "content": content, "tool_call_id": call_id(len(messages) - 1, k)})
        return StepResult(observation=tuple(results), done=False)

    def verify(self, task: Task, messages: list[dict]) -> Score:
        sid, client = self._client(messages)
        try:
            row = self.row(task)
            response = response_of(messages, len(task.prompt), row["responses_create_params"].get("tools", []))
            got = self._post(client, "/verify", {**row, "response": response})
        finally:
            self._sessions.pop(sid).close()
        reward = float(got["reward"])
        return Score(unit_reward(reward, self.reward_range), {"reward": reward, **measurements(got, row)},
                     f"verify: {reward:g}")

    def close(self) -> None:
        for c in self._sessions.values():
            c.close()
        self._sessions.clear()
        if self.process is not None:
            self.process.close()


def check_nemo_gym(server: str | None = None, url: str | None = None, data: str | None = None,
                   reward_range: tuple[float, float] = (0.0, 1.0), timeout_s: float = 60.0,
                   heldout_fraction: float = 0.2) -> None:
    """The options checked without starting anything (a config check; the run starts the server)."""
    if (server is None) == (url is None):
        raise ValueError("nemo_gym needs one of options server (module:Class, started by gymloop) or url")
    if server is not None and ":" not in server:
        raise ValueError(f"nemo_gym option server must be module:Class, not {server!r}")
    if data is not None and not Path(data).is_file():
        raise ValueError(f"nemo_gym option data: {data} is not a file")
    check_reward_range(reward_range, "nemo_gym")


def make_nemo_gym(**options) -> NemoGymEnvironment:
    return peer(NemoGymEnvironment)(options)
