"""gymloop's bridge to a verifiers environment (the v0 API: `load_environment(**args)` -> an
Environment with a dataset and a Rubric), run by verifiers' runtime python (its own venv), so it
imports nothing of gymloop. The environment's own code builds its dataset and scores with its
own rubric; gymloop speaks to this process in JSON lines (bridge_runner.py runs the protocol).

    python -P bridge_runner.py verifiers_bridge.py ENV_ID ARGS_JSON [--path DIR ...]

Its ready line is {"ready": true, "multi_turn": ..., "tool_defs": ...}; its requests, {"id", "op", ...}:
- rows {split: train|eval}: the split's rows (prompt messages, answer, info, example_id);
- start {split, index}: an episode: the environment's own `rollout()` runs with a verifiers
  Client whose model is gymloop (each response is the turn gymloop sends), so its stop
  conditions, env_response and cleanup are its own; answers the first prompt and a session;
- turn {session, content, tool_calls}: gymloop's turn; answers what the environment said back
  (its env_response messages) or done;
- finish {session, turns, last}: ends the rollout where gymloop stopped: a last turn the token
  limit cut goes over as a truncated response; an episode still asking for turns (gymloop's turn
  limit, the model's context) ends with verifiers' OverlongPromptError, a truncation; then the
  rubric's reward and metrics.
"""
from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
import uuid


def jsonable(value):
    """Messages and rows as plain JSON (verifiers keeps pydantic messages)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


FINISHED_KEPT = 4096                    # finished episodes whose scores a repeated finish answers


class Episode:
    """One multi-turn rollout in flight: verifiers asks for model turns, gymloop answers them."""

    def __init__(self) -> None:
        self.asks: asyncio.Queue = asyncio.Queue()      # each prompt verifiers asks a turn for; None: it ended
        self.answer: asyncio.Future | None = None
        self.asked = 0                                  # the length of the last prompt asked
        self.received = 0                               # turns gymloop has sent
        self.state = None
        self.done = False
        self.task: asyncio.Task | None = None

    async def ask(self, prompt: list):
        self.answer = asyncio.get_running_loop().create_future()
        self.asked = len(prompt)
        await self.asks.put(prompt)
        return await self.answer

    async def next_prompt(self):
        """The next prompt verifiers asks a turn for, or None when its rollout has ended."""
        prompt = await self.asks.get()
        self.done = prompt is None
        return prompt


def turns_client():
    """verifiers' model Client for a rollout whose model is gymloop: a response is the turn gymloop
    sends for the prompt (its tokens are gymloop's; verifiers sees the messages). Its `client` is
    the rollout's Episode."""
    from verifiers.clients import Client

    class GymloopTurns(Client):
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            return await self.client.ask(prompt)

        async def raise_from_native_response(self, response) -> None:
            return None

        async def from_native_response(self, response):
            return response

        async def close(self) -> None:
            return None

    return GymloopTurns


def response(content: str, calls: list[dict], truncated: bool = False):
    """gymloop's turn as the verifiers Response a model client returns."""
    from verifiers.types import Response, ResponseMessage, ToolCall

    tool_calls = [ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in calls] or None
    return Response(id=f"gymloop-{time.time_ns()}", created=int(time.time()), model="gymloop",
                    message=ResponseMessage(content=content, tool_calls=tool_calls, is_truncated=truncated,
                                            finish_reason="length" if truncated else
                                            "tool_calls" if tool_calls else "stop"))


class Bridge:
    """The environment and its episodes in flight; one method per request op."""

    def __init__(self, env) -> None:
        import verifiers as vf
        self.vf, self.env, self.episodes, self.finished = vf, env, {}, collections.OrderedDict()
        splits = {"train": env.dataset if env.dataset is not None else env.eval_dataset,
                  "eval": env.eval_dataset if env.eval_dataset is not None else env.dataset}
        self.data = {k: [dict(r) for r in d] for k, d in splits.items()}
        self.client = turns_client()
        self.multi_turn = isinstance(env, vf.MultiTurnEnv) and not isinstance(env, vf.SingleTurnEnv)

    async def rows(self, split: str) -> dict:
        return {"rows": jsonable([{k: r.get(k) for k in ("prompt", "answer", "info", "example_id")}
                                  for r in self.data[split]])}

    async def _rollout(self, ep: Episode, row: dict) -> None:
        try:
            ep.state = await self.env.rollout(row, client=self.client(ep), model="gymloop")
        finally:
            await ep.asks.put(None)

    async def start(self, split: str, index: int) -> dict:
        ep, sid = Episode(), uuid.uuid4().hex
        self.episodes[sid] = ep
        ep.task = asyncio.ensure_future(self._rollout(ep, dict(self.data[split][index])))
        prompt = await ep.next_prompt()
        return {"session": sid, "messages": jsonable(prompt or [])}

    async def turn(self, session: str, content: str, tool_calls: list[dict]) -> dict:
        ep = self.episodes[session]
        if ep.done:
            return {"done": True, "messages": []}
        asked = ep.asked
        ep.answer.set_result(response(content, tool_calls))
        ep.received += 1
        prompt = await ep.next_prompt()
        # the new prompt is the last one, the turn, then what the environment said back
        return {"done": prompt is None, "messages": jsonable(prompt[asked + 1:] if prompt else [])}

    async def finish(self, session: str, turns: int, last: dict | None = None) -> dict:
        """`turns`: how many turns the episode has on gymloop's side; `last`, its last turn, which
        gymloop did not send when the token limit cut it: it goes over as a truncated response."""
        if session in self.finished:             # scored before: the same answer again
            return self.finished[session]
        ep = self.episodes.pop(session)
        if not ep.done and last is not None and turns == ep.received + 1:
            ep.answer.set_result(response(last["content"], last["tool_calls"], truncated=True))
            ep.received += 1
            await ep.next_prompt()
        while not ep.done:
            ep.answer.set_exception(self.vf.OverlongPromptError(
                "gymloop ended the episode (its turn limit or the model's context)"))
            await ep.next_prompt()
        await ep.task
        await self.env.rubric.score_rollout(ep.state)
        self.finished[session] = {"reward": ep.state["reward"], "metrics": ep.state["metrics"]}
        if len(self.finished) > FINISHED_KEPT:
            self.finished.popitem(last=False)
        return self.finished[session]


def setup(argv: list[str]):
    """The ready line and the request handler (see bridge_runner.py)."""
    env_id, args = argv[0], json.loads(argv[1])
    for i, a in enumerate(argv):
        if a == "--path":
            sys.path.insert(0, argv[i + 1])
    import verifiers as vf

    bridge = Bridge(vf.load_environment(env_id, **args))
    ops = {op: getattr(bridge, op) for op in ("rows", "start", "turn", "finish")}

    async def handle(req: dict) -> dict:
        return await ops[req["op"]](**{k: v for k, v in req.items() if k not in ("id", "op")})

    ready = {"ready": True, "multi_turn": bridge.multi_turn, "kind": type(bridge.env).__name__,
             "tool_defs": jsonable(list(getattr(bridge.env, "tool_defs", None) or []))}
    return ready, handle
