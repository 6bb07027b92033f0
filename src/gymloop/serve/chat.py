"""POST /v1/chat/completions (plain and streamed): its request schema and route over the serving
core (core.py). A request without a valid key gets 401 and leaves no trace. A trace is committed
to the store before the response (or, streamed, its final chunk) is sent; the answering model
version is in the response.

    prepare (model, prompt, sampling, limits) -> generate -> answer (body, trace)
                                                 or stream (chunks, then answer)
"""
from __future__ import annotations

import json
from typing import AsyncIterator, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..models.chat import ChatTokenizer
from ..models.toolcalls import reply_message
from .config import ServeConfig
from .core import MAX_N, Prepared, Streamed, check_prompt, check_token_limits, commit_trace, for_caller, generate, \
    keep_calls, reply_text, resolve, sampling, session_of
from .http import APIError
from .openapi import error_responses, json_body, json_int
from .services import Caller, Services, caller, services


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
    seed: json_int(-2**63, 2**63 - 1) | None = Field(None, description="Sampling seed (OpenAI's int64 range).")
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
    return_token_ids: bool = Field(False, description="vLLM's extension, which RL drivers read: the prompt's token "
                                   "ids (`prompt_token_ids`) and each choice's sampled ids (`choices[].token_ids`), "
                                   "so whoever trains on them never re-tokenizes.")


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


async def prepare(svc: Services, req: ChatRequest, who: Caller) -> Prepared:
    """The model the request names, its prompt rendered by the chat template, the sampling; a 400
    for what exceeds a limit."""
    cfg = svc.cfg
    batcher, tok, name = await resolve(svc, req.model, who)
    check_token_limits(cfg, req, ("max_tokens", "max_completion_tokens"))
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    tools = [t.model_dump() for t in req.tools] if req.tools else None
    try:
        prompt = tok.prompt_ids(messages, tools=tools)
    except Exception as exc:  # noqa: BLE001 - a template that cannot render this input
        raise APIError(400, f"messages could not be rendered by the chat template: {exc}") from None
    check_prompt(cfg, prompt, "messages")
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    params, stop = sampling(tok, req.max_completion_tokens or req.max_tokens or cfg.default_max_tokens,
                            req.temperature, req.top_p, req.stop, req.seed,
                            (req.top_logprobs or 0) if req.logprobs else 0)
    return Prepared(req, who, batcher, tok, name, prompt, for_caller(svc, who, params, prompt), stop,
                    calls=bool(req.tools) and req.tool_choice != "none", messages=messages, tools=tools, n=req.n)


def choice(p: Prepared, gen, index: int) -> dict:
    """One choice of the answer: its text (or the tools it calls), why it ended, its log-probs
    when asked."""
    content, calls = reply_message(reply_text(p, gen)) if p.calls else (reply_text(p, gen), [])
    message = {"role": "assistant", "content": content, "refusal": None, **({"tool_calls": calls} if calls else {})}
    finish = "tool_calls" if calls else "stop" if gen.finish_reason == "stop" else "length"
    return {"index": index, "message": message, "finish_reason": finish,
            "logprobs": token_logprobs(p.tok, gen) if p.req.logprobs else None,
            **({"token_ids": list(gen.token_ids)} if p.req.return_token_ids else {})}


async def answer(svc: Services, p: Prepared, gens: list, version: int) -> tuple[dict, str]:
    """The chat.completion body of the finished generations (one per choice; usage counts every
    choice's tokens, the prompt once), and its trace id once the trace (all choices in one) is
    committed: before the response leaves, a 200 always has its trace."""
    n_prompt, n_gen = len(p.prompt), sum(len(g.token_ids) for g in gens)
    body = {"id": p.cid, "object": "chat.completion", "created": p.created, "model": p.name,
            "system_fingerprint": f"gymloop-v{version}", "model_version": version,
            "choices": [choice(p, g, i) for i, g in enumerate(gens)],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen},
            **({"prompt_token_ids": list(p.prompt)} if p.req.return_token_ids else {})}
    await keep_calls(svc, p, gens, version)
    return body, await commit_trace(svc, p, body, version, n_gen)


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


def router(cfg: ServeConfig) -> APIRouter:
    """POST /v1/chat/completions. `cfg` only shapes the documented schema (the served name, the
    token limits); requests are served by the app's Services."""
    r = APIRouter()

    @r.post("/v1/chat/completions", openapi_extra=json_body(ChatRequest, {
        "model": {"enum": [cfg.served_name()]}, "max_tokens": {"maximum": cfg.max_tokens_limit},
        "max_completion_tokens": {"maximum": cfg.max_tokens_limit}}), responses={
        200: {"description": "a chat.completion, or with stream: true a text/event-stream of chunks",
              "content": {"application/json": {}, "text/event-stream": {}}}, **error_responses(400, 401, 404, 413)})
    async def chat(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
        p = session_of(request, await prepare(svc, await svc.body(request, ChatRequest), who))
        if p.req.stream:
            return StreamingResponse(stream(svc, p), media_type="text/event-stream",
                                     headers={"x-gymloop-trace-id": p.cid})
        gens, version = await generate(p)
        body, trace_id = await answer(svc, p, gens, version)
        return JSONResponse(body, headers={"x-gymloop-trace-id": trace_id, "x-gymloop-model-version": str(version)})

    return r
