"""The chat routes of `gymloop serve`: GET /v1/models, POST /v1/chat/completions (plain and
streamed), POST /v1/feedback. A request without a valid key gets 401 and leaves no trace. A
trace is committed to the store before the response (or, streamed, its final chunk) is sent;
the answering model version is in the response.

    prepare (model, prompt, sampling, limits) -> generate (batcher) -> answer (body, trace)
                                                 or stream (chunks, then answer)
"""
from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..engine import SamplingParams
from ..models.chat import ChatTokenizer
from ..models.toolcalls import reply_message, visible_text
from ..store import StoreError
from .batcher import Batcher, BatcherStopped
from .config import ServeConfig
from .http import APIError
from .openapi import error_responses, json_body, json_int
from .services import Caller, Services, caller, services

JSONInt = json_int()
MAX_N = 64             # choices per request (a GRPO group; OpenAI's own limit is 128)


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str
    arguments: str = Field(description="The arguments as a JSON object, written as a string (OpenAI's form).")


class MessageToolCall(BaseModel):
    """A call an assistant message made (a conversation's earlier turn)."""

    model_config = ConfigDict(extra="allow", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="Who wrote the message; any other role is a 400.")
    content: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(None, description="An assistant's calls (rendered in the "
                                                     "model's tool format).")
    tool_call_id: str | None = Field(None, description="A tool message: the call it answers.")


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}},
                             description="JSON schema of the arguments (default: none).")


class ChatTool(BaseModel):
    """A tool the model may call (OpenAI's function tool), rendered by the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatRequest(BaseModel):
    """The subset of OpenAI's chat request gymloop acts on; other fields are accepted and ignored.
    Strict: a value of the wrong JSON type ("5" for 5) is a 400, not silently converted."""

    # top_logprobs > 0 needs logprobs: true (as OpenAI's API), stated in the schema too
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={
        "if": {"properties": {"top_logprobs": {"type": "integer", "minimum": 1}}, "required": ["top_logprobs"]},
        "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}})
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: json_int(1) | None = None
    max_completion_tokens: json_int(1) | None = None
    temperature: float = Field(1.0, ge=0, le=2, description="0 (or below 1e-4, where logits / T overflows): "
                               "greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    stream: bool = False
    n: json_int(1, MAX_N) = Field(1, description="Choices to sample for the prompt (one group in the engine's "
                                  "batch, one trace with all of them).")
    seed: JSONInt | None = None
    tools: list[ChatTool] | None = Field(None, description="Functions the model may call: rendered into the prompt "
                                         "(by the chat template, or in gymloop's tool format), and a reply "
                                         "that calls them answered as `tool_calls`.")
    tool_choice: Literal["none", "auto", "required"] | dict | None = Field(
        None, description="\"none\": replies are text even when they hold a call; otherwise replies are "
        "parsed for calls (the model is not forced to call one).")
    logprobs: bool = Field(False, description="Return the log-prob of each generated token (under the sampling "
                           "temperature's distribution, as the engine samples and a trainer recomputes).")
    top_logprobs: json_int(0, 20) | None = Field(None, description="With logprobs: also the k most likely tokens "
                                     "at each position.")


class TaskRef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    env: str
    version: JSONInt | None = None
    task_id: str | None = None


class FeedbackRequest(BaseModel):
    # "a reward or a label" stated in the schema too, so /openapi.json documents what is accepted
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"required": ["reward"], "properties": {"reward": {"type": "number"}}},
        {"required": ["label"], "properties": {"label": {"type": "string"}}}]})
    trace_id: str
    reward: float | None = Field(None, ge=0, le=1)
    label: str | None = Field(None, max_length=200)
    task: TaskRef | None = None



def _token_entry(tok: ChatTokenizer, token_id: int, logprob: float) -> dict:
    text = tok.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def token_logprobs(tok: ChatTokenizer, gen) -> dict:
    """OpenAI's `choices[].logprobs`: one entry per generated token (EOS included, as sampled),
    each with its `top_logprobs` when they were asked for."""
    content = []
    for i, (t, lp) in enumerate(zip(gen.token_ids, gen.logprobs)):
        entry = _token_entry(tok, t, lp)
        entry["top_logprobs"] = [_token_entry(tok, a, b) for a, b in gen.top_logprobs[i]] if gen.top_logprobs else []
        content.append(entry)
    return {"content": content, "refusal": None}



@dataclass
class Prepared:
    """A chat request checked against the server's limits: what to run and how to answer."""

    req: ChatRequest
    caller: Caller
    batcher: Batcher
    tok: ChatTokenizer
    name: str                    # the model name answered with
    prompt: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    calls: bool = False          # replies are read for tool calls (the request gave tools)
    cid: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))
    t0: float = field(default_factory=time.perf_counter)


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


async def prepare(svc: Services, req: ChatRequest, who: Caller) -> Prepared:
    """The model the request names (a fine-tuned one may be loaded first, off the event loop),
    its prompt rendered by the chat template, the sampling; a 400 for what exceeds a limit."""
    cfg = svc.cfg
    batcher, tok, name = (svc.served(req.model, who.tenant) if req.model == svc.name
                          else await run_in_threadpool(svc.served, req.model, who.tenant))
    check_token_limits(cfg, req, ("max_tokens", "max_completion_tokens"))
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    try:
        prompt = tok.prompt_ids(messages, tools=[t.model_dump() for t in req.tools] if req.tools else None)
    except Exception as exc:  # noqa: BLE001 - a template that cannot render this input
        raise APIError(400, f"messages could not be rendered by the chat template: {exc}") from None
    check_prompt(cfg, prompt, "messages")
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    params = SamplingParams(max_new_tokens=req.max_completion_tokens or req.max_tokens or cfg.default_max_tokens,
                            temperature=req.temperature if req.temperature >= 1e-4 else 0.0, top_p=req.top_p,
                            stop_token_ids=tok.eos_token_ids, stop=stop, seed=req.seed,
                            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0)
    return Prepared(req, who, batcher, tok, name, prompt, params, stop,
                    calls=bool(req.tools) and req.tool_choice != "none")


def reply_text(p: Prepared, gen) -> str:
    """A generation's text cut at a stop string (OpenAI semantics: the stop string itself is not
    part of the answer)."""
    text = p.tok.decode(gen.token_ids)
    for s in p.stop:
        if s and s in text:
            text = text[: text.index(s)]
    return text


def choice(p: Prepared, gen, index: int) -> dict:
    """One choice of the answer: its text (or the tools it calls), why it ended, its log-probs
    when asked."""
    content, calls = reply_message(reply_text(p, gen)) if p.calls else (reply_text(p, gen), [])
    message = {"role": "assistant", "content": content, "refusal": None, **({"tool_calls": calls} if calls else {})}
    finish = "tool_calls" if calls else "stop" if gen.finish_reason == "stop" else "length"
    return {"index": index, "message": message, "finish_reason": finish,
            "logprobs": token_logprobs(p.tok, gen) if p.req.logprobs else None}


async def answer(svc: Services, p: Prepared, gens: list, version: int) -> tuple[dict, str]:
    """The chat.completion body of the finished generations (one per choice; usage counts every
    choice's tokens, the prompt once), and its trace id once the trace (all choices in one) is
    committed: before the response leaves, a 200 always has its trace."""
    n_prompt, n_gen = len(p.prompt), sum(len(g.token_ids) for g in gens)
    body = {"id": p.cid, "object": "chat.completion", "created": p.created, "model": p.name,
            "system_fingerprint": f"gymloop-v{version}", "model_version": version,
            "choices": [choice(p, g, i) for i, g in enumerate(gens)],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}}
    return body, await commit_trace(svc, p, body, version, n_gen)


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


def submit_group(p: Prepared, on_token=None) -> list:
    """The request's n samples (1 without `n`), submitted at once with the same sampling
    parameters, so the batcher runs them as one group of one engine batch (with a seed: one
    generator, n draws). `on_token(index, token)` streams each choice's tokens."""
    return [p.batcher.submit(p.prompt, p.params,
                             on_token=None if on_token is None else functools.partial(on_token, i))
            for i in range(getattr(p.req, "n", 1))]


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


async def stream(svc: Services, p: Prepared) -> AsyncIterator[str]:
    """The answer as server-sent chunks while it is generated, each naming its choice's index;
    the last chunks (the rest of the text, the tool calls) follow the committed trace."""
    s = Streamed.submit(p)

    def chunk(index: int, delta: dict, finish_reason=None) -> str:
        version = s.version if s.version >= 0 else p.batcher.version
        return "data: " + json.dumps({
            "id": p.cid, "object": "chat.completion.chunk", "created": p.created, "model": p.name,
            "system_fingerprint": f"gymloop-v{version}",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}]}) + "\n\n"

    for i in range(len(s.rs)):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for i, delta in s.deltas(p):
        yield chunk(i, {"content": delta})
    body, _ = await answer(svc, p, await s.results(), s.rs[0].version)
    for c in body["choices"]:
        i, msg = c["index"], c["message"]
        if rest := s.rest(i, msg["content"]):
            yield chunk(i, {"content": rest})
        if msg.get("tool_calls"):
            yield chunk(i, {"tool_calls": [{"index": k, **tc} for k, tc in enumerate(msg["tool_calls"])]})
        yield chunk(i, {}, c["finish_reason"])
    yield "data: [DONE]\n\n"


def chat_router(cfg: ServeConfig) -> APIRouter:
    """/v1/models, /v1/chat/completions, /v1/feedback. `cfg` only shapes the documented schema
    (the served name, the token limits); requests are served by the app's Services."""
    router = APIRouter()
    name = cfg.served_name()

    @router.get("/v1/models", responses=error_responses(401))
    async def models(svc: Services = Depends(services), who: Caller = Depends(caller)):
        data = [{"id": svc.name, "object": "model", "created": 0, "owned_by": "gymloop",
                 "version": svc.batcher.version}]
        data += [{"id": m["id"], "object": "model", "created": int(m["created"]), "owned_by": who.tenant,
                  "fine_tuning_job": m["job"]} for m in svc.store.jobs.fine_tuned_models(who.tenant)]
        return {"object": "list", "data": data}

    @router.post("/v1/chat/completions", openapi_extra=json_body(ChatRequest, {
        "model": {"enum": [name]}, "max_tokens": {"maximum": cfg.max_tokens_limit},
        "max_completion_tokens": {"maximum": cfg.max_tokens_limit}}), responses={
        200: {"description": "a chat.completion, or with stream: true a text/event-stream of chunks",
              "content": {"application/json": {}, "text/event-stream": {}}}, **error_responses(400, 401, 404, 413)})
    async def chat(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
        p = await prepare(svc, await svc.body(request, ChatRequest), who)
        if p.req.stream:
            return StreamingResponse(stream(svc, p), media_type="text/event-stream",
                                     headers={"x-gymloop-trace-id": p.cid})
        rs = submit_group(p)
        try:
            gens = await asyncio.gather(*(asyncio.wrap_future(r.future) for r in rs))
        except BatcherStopped as exc:
            raise APIError(503, str(exc), "server_error") from None
        body, trace_id = await answer(svc, p, list(gens), rs[0].version)
        return JSONResponse(body, headers={"x-gymloop-trace-id": trace_id,
                                           "x-gymloop-model-version": str(rs[0].version)})

    @router.post("/v1/feedback", openapi_extra=json_body(FeedbackRequest), responses=error_responses(400, 401, 404, 413))
    async def feedback(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
        fb: FeedbackRequest = await svc.body(request, FeedbackRequest)
        if fb.reward is None and fb.label is None:
            raise APIError(400, "feedback needs a reward (0..1) or a label", param="reward")
        try:
            fid = await run_in_threadpool(
                svc.store.traces.add_feedback, fb.trace_id, reward=fb.reward, label=fb.label,
                env=fb.task.env if fb.task else None, env_version=fb.task.version if fb.task else None,
                task_id=fb.task.task_id if fb.task else None)
        except StoreError as exc:
            raise APIError.of(exc, param="trace_id") from None
        svc.metrics.count(200)
        return {"id": fid, "trace_id": fb.trace_id}

    return router
