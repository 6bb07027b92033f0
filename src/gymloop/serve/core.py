"""The serving core every API module shares: a request checked against the server's limits and
its model resolved (`Prepared`), its samples submitted as one group to the batcher, their
generations awaited (or streamed), and the answer's trace committed before the response leaves.

    resolve (model) -> sampling (params) -> Prepared -> generate | Streamed -> commit_trace

An API module (chat.py, completions.py, responses.py) owns its request and response schemas and
turns a request into a Prepared and generations into its answer's shape."""
from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from ..engine import SamplingParams
from ..models.chat import ChatTokenizer
from ..models.toolcalls import reply_message, visible_text
from .batcher import Batcher, BatcherStopped
from .config import ServeConfig
from .http import APIError
from .services import Caller, Services

MAX_N = 64             # choices per request (a GRPO group; OpenAI's own limit is 128)


@dataclass
class Prepared:
    """A request checked against the server's limits: what to run and how to answer."""

    req: BaseModel
    caller: Caller
    batcher: Batcher
    tok: ChatTokenizer
    name: str                    # the model name answered with
    prompt: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    calls: bool = False          # replies are read for tool calls (the request gave tools)
    messages: list[dict] = field(default_factory=list)   # the conversation as rendered (chat messages)
    tools: list[dict] | None = None                      # the tools as rendered (OpenAI's chat form)
    session: str | None = None                           # a production session's id (SESSION_HEADER)
    session_task: dict | None = None                     # ... and the task it named (TASK_HEADER)
    n: int = 1                   # choices: samples of the prompt, one group of the engine's batch
    cid: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))
    t0: float = field(default_factory=time.perf_counter)

    def with_id_prefix(self, prefix: str) -> "Prepared":
        """The answer's id with another prefix (cmpl-, resp_), the same random part."""
        self.cid = prefix + self.cid.split("-", 1)[1]
        return self


async def resolve(svc: Services, model: str, who: Caller) -> tuple[Batcher, ChatTokenizer, str]:
    """The batcher, tokenizer and answered name of the model a request names; a fine-tuned model
    is loaded first, off the event loop (404 for a model the caller cannot use)."""
    if model == svc.name:
        return svc.served(model, who.tenant)
    return await run_in_threadpool(svc.served, model, who.tenant)


def check_token_limits(cfg: ServeConfig, req: BaseModel, fields: tuple[str, ...]) -> None:
    """400 for a token count over the server's limit (each field, even the one not used)."""
    for f in fields:
        value = getattr(req, f)
        if value is not None and value > cfg.max_tokens_limit:
            raise APIError(400, f"{f} {value} exceeds the limit of {cfg.max_tokens_limit}", param=f)


def check_prompt(cfg: ServeConfig, prompt: list[int], param: str) -> None:
    if len(prompt) > cfg.max_prompt_tokens:
        raise APIError(400, f"prompt of {len(prompt)} tokens exceeds the limit of {cfg.max_prompt_tokens}",
                       param=param)


def sampling(tok: ChatTokenizer, max_new_tokens: int, temperature: float, top_p: float,
             stop: str | list[str] | None = None, seed: int | None = None,
             top_logprobs: int = 0) -> tuple[SamplingParams, tuple[str, ...]]:
    """The engine's sampling parameters of a request, and its stop strings. A temperature below
    1e-4 is greedy (logits / T would overflow)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature if temperature >= 1e-4 else 0.0,
                          top_p=top_p, stop_token_ids=tok.eos_token_ids, stop=stops, seed=seed,
                          top_logprobs=top_logprobs), stops


def for_caller(svc: Services, who: Caller, params: SamplingParams, prompt: list[int]) -> SamplingParams:
    """The sampling a request runs with: its own, except an agent program's episode, which samples
    as the training run does (the behaviour log-probs must be the policy's, whatever it asks),
    within the room its prompt leaves in the context (the gateway's max_prompt_tokens)."""
    if who.episode is None or svc.capture is None:
        return params
    return svc.capture.sampling(who.episode, params, room=svc.cfg.max_prompt_tokens - len(prompt))


SESSION_HEADER = "x-gymloop-session"      # names a production session of an agent program
TASK_HEADER = "x-gymloop-task"            # the session's task, a JSON object (what the loop re-runs it on)


def session_of(request, p: Prepared) -> Prepared:
    """The production session a request names (its headers), checked: a 400 for a bad one."""
    sid = request.headers.get(SESSION_HEADER)
    if sid is None:
        return p
    if not 1 <= len(sid) <= 128 or not sid.isprintable():
        raise APIError(400, f"{SESSION_HEADER} must be 1 to 128 printable characters", param=SESSION_HEADER)
    raw = request.headers.get(TASK_HEADER)
    if raw is not None:
        try:
            task = json.loads(raw)
        except json.JSONDecodeError:
            task = None
        if not isinstance(task, dict):
            raise APIError(400, f"{TASK_HEADER} must be a JSON object", param=TASK_HEADER)
        p.session_task = task
    p.session = sid
    return p


def captured_calls(p: Prepared, gens: list, version: int) -> list[dict]:
    """Each choice as a captured call (rollout/capture.py's Call fields): the conversation it
    answered, its exact prompt ids, sampled ids and behaviour log-probs, and the reply the caller
    got. Only for an agent program's episode or a production session."""
    if p.caller.episode is None and p.session is None:
        return []
    eos = set(p.tok.eos_token_ids)
    out = []
    for gen in gens:
        content, calls = reply_message(reply_text(p, gen)) if p.calls else (reply_text(p, gen), [])
        out.append({"messages": p.messages, "tools": p.tools, "prompt_ids": list(p.prompt),
                    "token_ids": list(gen.token_ids), "logprobs": list(gen.logprobs),
                    "reply": {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})},
                    "version": version, "ended": bool(gen.token_ids) and gen.token_ids[-1] in eos})
    return out


async def keep_calls(svc: Services, p: Prepared, gens: list, version: int) -> None:
    """An episode's calls to its capture; a session's to the store (before the answer leaves)."""
    calls = captured_calls(p, gens, version)
    if p.caller.episode is not None and svc.capture is not None:
        for call in calls:
            svc.capture.record(p.caller.episode, **call)
    if p.session is not None:
        await run_in_threadpool(svc.store.sessions.add_calls, p.session, p.cid, p.caller.key_id, calls,
                                p.session_task)


def reply_text(p: Prepared, gen) -> str:
    """A generation's text cut at a stop string (OpenAI semantics: the stop string itself is not
    part of the answer)."""
    text = p.tok.decode(gen.token_ids)
    for s in p.stop:
        if s and s in text:
            text = text[: text.index(s)]
    return text


def submit_group(p: Prepared, on_token=None) -> list:
    """The request's n samples, submitted at once with the same sampling
    parameters, so the batcher runs them as one group of one engine batch (with a seed: one
    generator, n draws). `on_token(index, token)` streams each choice's tokens."""
    return [p.batcher.submit(p.prompt, p.params,
                             on_token=None if on_token is None else functools.partial(on_token, i))
            for i in range(p.n)]


async def generate(p: Prepared) -> tuple[list, int]:
    """The request's generations, one per choice, and the model version that made them (503
    when the batcher stopped under them)."""
    rs = submit_group(p)
    try:
        gens = await asyncio.gather(*(asyncio.wrap_future(r.future) for r in rs))
    except BatcherStopped as exc:
        raise APIError(503, str(exc), "server_error") from None
    return list(gens), rs[0].version


async def commit_trace(svc: Services, p: Prepared, body: dict, version: int, n_gen: int,
                       request: dict | None = None) -> str:
    """The answer's trace, committed (group commit) before the response leaves; its id. `request`:
    what the trace records of the request (default: the request as received)."""
    latency = time.perf_counter() - p.t0
    trace_id = await asyncio.wrap_future(svc.store.traces.add_committed(
        model=p.name, model_version=version, response=body,
        request=request if request is not None else p.req.model_dump(exclude_none=True),
        prompt_tokens=len(p.prompt), completion_tokens=n_gen, latency_s=latency, key_id=p.caller.key_id,
        trace_id=p.cid))
    svc.metrics.answered(n_gen, latency)
    return trace_id


@dataclass
class Streamed:
    """A request's samples being generated, their tokens arriving on a queue, and the text each
    choice has shown so far."""

    rs: list
    tokens: asyncio.Queue
    shown: list[str]

    @classmethod
    def submit(cls, p: Prepared) -> "Streamed":
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()
        rs = submit_group(p, lambda i, t: loop.call_soon_threadsafe(tokens.put_nowait, (i, t)))
        return cls(rs, tokens, ["" for _ in rs])

    @property
    def version(self) -> int:
        return self.rs[0].version if self.rs[0].version >= 0 else -1

    async def deltas(self, p: Prepared) -> AsyncIterator[tuple[int, str]]:
        """(choice, new text) as tokens arrive, until every sample is done; text that may turn
        into a stop string or a tool call is held back (`rest` gives it once the answer is whole)."""
        done = [asyncio.wrap_future(r.future) for r in self.rs]
        sent: list[list[int]] = [[] for _ in self.rs]
        while not (all(d.done() for d in done) and self.tokens.empty()):
            try:
                i, t = await asyncio.wait_for(self.tokens.get(), timeout=0.05)
            except asyncio.TimeoutError:
                continue
            if t in p.tok.eos_token_ids:
                continue
            sent[i].append(t)
            text = p.tok.decode(sent[i])
            if p.stop and any(s in text for s in p.stop):
                continue       # held back; the final text is cut at the stop string
            text = visible_text(text) if p.calls else text
            if len(text) > len(self.shown[i]):
                delta, self.shown[i] = text[len(self.shown[i]):], text
                yield i, delta

    async def results(self) -> list:
        return list(await asyncio.gather(*(asyncio.wrap_future(r.future) for r in self.rs)))

    def rest(self, i: int, final: str | None) -> str:
        """What choice `i`'s final text adds to what it has shown ("" when nothing, or when the
        final text does not continue it)."""
        final = final or ""
        return final[len(self.shown[i]):] if final.startswith(self.shown[i]) else ""
