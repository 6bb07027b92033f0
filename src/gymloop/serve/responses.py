"""The Responses API (the one OpenAI's Agents SDK and most agent frameworks speak), over the same
engine and store as chat completions: POST /v1/responses (input as text or items, instructions,
function tools rendered by the chat template, previous_response_id to continue a conversation)
and GET /v1/responses/{id}. Every response is a trace (its id is the response's), so feedback can
name it and the next turn can continue it. Streaming is not offered yet (a 400 says so); the model's
reply is one output message (turning replies into function calls is the real-model issue's)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..engine import SamplingParams
from .batcher import BatcherStopped
from .chat import Prepared, check_prompt, commit_trace, reply_text
from .config import ServeConfig
from .http import APIError
from .openapi import error_responses, json_body, json_int
from .services import Caller, Services, caller, services


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponseRequest(BaseModel):
    """The subset of OpenAI's CreateResponse gymloop acts on; other fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[dict[str, Any]] = Field(description="Text (one user message) or input items: messages "
                                                "({role, content}), function_call and function_call_output.")
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    previous_response_id: str | None = None
    max_output_tokens: json_int(1) | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stream: bool = False
    metadata: dict[str, str] | None = None


def _text(content: Any) -> str:
    """A message's content: a string, or parts ({type: input_text | output_text, text}) joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise APIError(400, "input: a message's content is a string or a list of text parts", param="input")


def item_messages(items: str | list[dict]) -> list[dict]:
    """Input items as chat messages: messages as they are, a function call as the assistant's call
    (its JSON), a function call's output as a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise APIError(400, f"input[{i}].role must be system, developer, user or assistant", param="input")
            out.append({"role": role, "content": _text(item.get("content", ""))})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": json.dumps({"name": item.get("name"),
                                                                    "arguments": item.get("arguments")})})
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": _text(item.get("output", ""))})
        else:
            raise APIError(400, f"input[{i}].type {kind!r} is not supported (message, function_call, "
                           "function_call_output)", param="input")
    return out


def conversation(svc: Services, req: ResponseRequest, who: Caller) -> list[dict]:
    """The messages the model answers: the previous response's conversation and its answer (when
    continuing one of this key's responses), the instructions first, then this input."""
    before: list[dict] = []
    if req.previous_response_id:
        prev = svc.store.traces.get(req.previous_response_id)
        if prev is None or prev["key_id"] != who.key_id or prev["response"].get("object") != "response":
            raise APIError(404, f"No such response: {req.previous_response_id}", param="previous_response_id")
        before = [m for m in prev["request"]["gymloop_messages"] if m["role"] not in ("system", "developer")]
        before += [{"role": "assistant", "content": c["text"]} for item in prev["response"]["output"]
                   if item["type"] == "message" for c in item["content"]]
    head = [{"role": "system", "content": req.instructions}] if req.instructions else []
    return head + before + item_messages(req.input)


async def _prepare(svc: Services, req: ResponseRequest, who: Caller) -> tuple[Prepared, list[dict]]:
    if req.stream:
        raise APIError(400, "stream is not offered on /v1/responses yet", param="stream")
    batcher, tok, name = (svc.served(req.model, who.tenant) if req.model == svc.name
                          else await run_in_threadpool(svc.served, req.model, who.tenant))
    if req.max_output_tokens is not None and req.max_output_tokens > svc.cfg.max_tokens_limit:
        raise APIError(400, f"max_output_tokens {req.max_output_tokens} exceeds the limit of "
                       f"{svc.cfg.max_tokens_limit}", param="max_output_tokens")
    messages = conversation(svc, req, who)
    tools = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})} for t in req.tools]
    try:
        prompt = tok.prompt_ids(messages, tools=tools or None)
    except Exception as exc:  # noqa: BLE001 - a template that cannot render this input
        raise APIError(400, f"input could not be rendered by the chat template: {exc}") from None
    check_prompt(svc.cfg, prompt, "input")
    params = SamplingParams(max_new_tokens=req.max_output_tokens or svc.cfg.default_max_tokens,
                            temperature=req.temperature if req.temperature >= 1e-4 else 0.0, top_p=req.top_p,
                            stop_token_ids=tok.eos_token_ids)
    p = Prepared(req, who, batcher, tok, name, prompt, params, ())
    p.cid = "resp_" + p.cid.split("-", 1)[1]
    return p, messages


def response_body(p: Prepared, gen, version: int) -> dict:
    """OpenAI's Response object for one finished generation: one output message."""
    req: ResponseRequest = p.req
    done = gen.finish_reason == "stop"
    n_out = len(gen.token_ids)
    return {
        "id": p.cid, "object": "response", "created_at": p.created, "completed_at": time.time(),
        "status": "completed" if done else "incomplete", "error": None,
        "incomplete_details": None if done else {"reason": "max_output_tokens"},
        "instructions": req.instructions, "metadata": req.metadata or {}, "model": p.name,
        "model_version": version, "previous_response_id": req.previous_response_id,
        "output": [{"type": "message", "id": "msg_" + p.cid[5:], "status": "completed" if done else "incomplete",
                    "role": "assistant", "content": [{"type": "output_text", "text": reply_text(p, gen),
                                                       "annotations": [], "logprobs": []}]}],
        "parallel_tool_calls": False, "temperature": req.temperature, "top_p": req.top_p, "tool_choice": "auto",
        "tools": [t.model_dump(exclude_none=True) for t in req.tools],
        "usage": {"input_tokens": len(p.prompt), "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": len(p.prompt) + n_out}}


def responses_router(cfg: ServeConfig) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/responses", openapi_extra=json_body(ResponseRequest, {"model": {"enum": [cfg.served_name()]}}),
                 responses=error_responses(400, 401, 404, 413))
    async def create(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
        req: ResponseRequest = await svc.body(request, ResponseRequest)
        p, messages = await _prepare(svc, req, who)
        r = p.batcher.submit(p.prompt, p.params)
        try:
            gen = await asyncio.wrap_future(r.future)
        except BatcherStopped as exc:
            raise APIError(503, str(exc), "server_error") from None
        body = response_body(p, gen, r.version)
        # the conversation as answered rides with the request, so previous_response_id can continue it
        await commit_trace(svc, p, body, r.version, len(gen.token_ids),
                           request={**req.model_dump(exclude_none=True), "gymloop_messages": messages})
        return JSONResponse(body, headers={"x-gymloop-trace-id": p.cid, "x-gymloop-model-version": str(r.version)})

    @router.get("/v1/responses/{response_id}", responses=error_responses(401, 404))
    async def retrieve(response_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
        trace = svc.store.traces.get(response_id)
        if trace is None or trace["key_id"] != who.key_id or trace["response"].get("object") != "response":
            raise APIError(404, f"No such response: {response_id}", param="response_id")
        return trace["response"]

    return router

