"""The Responses API (the one OpenAI's Agents SDK and most agent frameworks speak), over the same
engine and store as chat completions: POST /v1/responses (input as text or items, instructions,
function tools, previous_response_id to continue a conversation; plain or streamed as OpenAI's
events) and GET /v1/responses/{id}. Tools and calls go through the one tool format
(`models/toolcalls.py`): a reply that calls tools is answered as `function_call` output items.
Every response is a trace (its id is the response's), so feedback can name it and the next turn
can continue it.

    _prepare (conversation, prompt, sampling) -> generate -> response_body -> trace
                                                 or stream_events (deltas, then the items whole)
"""
from __future__ import annotations

import itertools
import json
import time
from typing import Annotated, Any, AsyncIterator, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..models.toolcalls import reply_message
from .core import Prepared, Streamed, check_prompt, commit_trace, for_caller, generate, keep_calls, reply_text, \
    resolve, sampling, session_of
from .config import ServeConfig
from .http import APIError
from .openapi import error_responses, json_body, json_int
from .services import Caller, Services, caller, services


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def echoed(self) -> dict:
        """As a Response lists it (parameters and strict always present, null when not given)."""
        return {**self.model_dump(exclude_none=True), "parameters": self.parameters, "strict": self.strict}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str = Field(description="input_text or output_text (others: their text, when they have one).")
    text: str = ""


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]


class FunctionCallItem(BaseModel):
    """A call the model made (an earlier turn, as the Agents SDK sends it back)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = Field(description="The arguments as a JSON object, written as a string.")


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]


class ResponseRequest(BaseModel):
    """The subset of OpenAI's CreateResponse gymloop acts on; other fields are accepted and ignored.
    Strict: a value of the wrong JSON type (0 for false) is a 400, not silently converted."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    input: str | Annotated[list[MessageItem | FunctionCallItem | FunctionCallOutputItem], Field(min_length=1)] = Field(
        description="Text (one user message) or input items: messages ({role, content}), function_call and "
        "function_call_output.")
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | dict | None = Field(
        None, description="\"none\": the reply is text even when it holds a call; otherwise a reply that "
        "calls tools is answered as function_call items (the model is not forced to call one).")
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


def _call(item: dict, i: int) -> dict:
    """A function_call item as an OpenAI chat tool call."""
    name, args = item.get("name"), item.get("arguments", "{}")
    if not isinstance(name, str) or not isinstance(args, str):
        raise APIError(400, f"input[{i}]: a function_call has a string name and arguments", param="input")
    return {"id": item.get("call_id") or item.get("id") or f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": args}}


def item_messages(items: str | list[dict]) -> list[dict]:
    """Input items as chat messages: messages as they are; function calls as the assistant's
    `tool_calls` (joined to the assistant turn they follow, as the model wrote them: its text, then
    its calls); a function call's output as a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise APIError(400, f"input[{i}].role must be system, developer, user or assistant", param="input")
            out.append({"role": role, "content": _text(item.get("content", ""))})
        elif kind == "function_call":
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": None})
            out[-1].setdefault("tool_calls", []).append(_call(item, i))
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(item.get("output", ""))})
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
        before += item_messages([_as_input(item) for item in prev["response"]["output"]])
    head = [{"role": "system", "content": req.instructions}] if req.instructions else []
    return head + before + item_messages(req.input if isinstance(req.input, str) else
                                         [item.model_dump() for item in req.input])


def _as_input(item: dict) -> dict:
    """An output item of an earlier response as the input item that repeats it."""
    if item["type"] == "message":
        return {"role": "assistant", "content": "".join(c.get("text", "") for c in item["content"])}
    return item


async def _prepare(svc: Services, req: ResponseRequest, who: Caller) -> tuple[Prepared, list[dict]]:
    batcher, tok, name = await resolve(svc, req.model, who)
    if req.max_output_tokens is not None and req.max_output_tokens > svc.cfg.max_tokens_limit:
        raise APIError(400, f"max_output_tokens {req.max_output_tokens} exceeds the limit of "
                       f"{svc.cfg.max_tokens_limit}", param="max_output_tokens")
    messages = conversation(svc, req, who)
    tools = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type", "strict"})} for t in req.tools]
    try:
        prompt = tok.prompt_ids(messages, tools=tools or None)
    except Exception as exc:  # noqa: BLE001 - a template that cannot render this input
        raise APIError(400, f"input could not be rendered by the chat template: {exc}") from None
    check_prompt(svc.cfg, prompt, "input")
    params, stop = sampling(tok, req.max_output_tokens or svc.cfg.default_max_tokens, req.temperature, req.top_p)
    p = Prepared(req, who, batcher, tok, name, prompt, for_caller(svc, who, params, prompt), stop,
                 calls=bool(req.tools) and req.tool_choice != "none", messages=messages, tools=tools or None)
    return p.with_id_prefix("resp_"), messages


def output_items(p: Prepared, text: str, done: bool) -> list[dict]:
    """The reply as output items: a message with its text (when there is text), then a
    function_call item per tool call."""
    content, calls = reply_message(text) if p.calls else (text, [])
    status = "completed" if done else "incomplete"
    items = [] if content is None and calls else [
        {"type": "message", "id": "msg_" + p.cid[5:], "status": status, "role": "assistant",
         "content": [{"type": "output_text", "text": content or "", "annotations": [], "logprobs": []}]}]
    return items + [{"type": "function_call", "id": f"fc_{c['id'][5:]}", "call_id": c["id"], "status": "completed",
                     "name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]


def response_body(p: Prepared, gen, version: int) -> dict:
    """OpenAI's Response object for one finished generation."""
    done = gen.finish_reason == "stop"
    return {**_envelope(p, version, "completed" if done else "incomplete"),
            "completed_at": time.time(), "incomplete_details": None if done else {"reason": "max_output_tokens"},
            "output": output_items(p, reply_text(p, gen), done),
            "usage": {"input_tokens": len(p.prompt), "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": len(gen.token_ids), "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": len(p.prompt) + len(gen.token_ids)}}


def _envelope(p: Prepared, version: int, status: str) -> dict:
    """The fields of a Response that do not depend on the reply (no usage yet)."""
    req: ResponseRequest = p.req
    return {"id": p.cid, "object": "response", "created_at": p.created, "status": status, "error": None,
            "incomplete_details": None, "instructions": req.instructions, "metadata": req.metadata or {},
            "model": p.name, "model_version": version, "previous_response_id": req.previous_response_id,
            "output": [], "parallel_tool_calls": False, "temperature": req.temperature, "top_p": req.top_p,
            "tool_choice": req.tool_choice or "auto", "tools": [t.echoed() for t in req.tools]}


async def _committed(svc: Services, p: Prepared, gen, version: int, messages: list[dict]) -> dict:
    """The response body, once its trace is committed (the conversation as answered rides with the
    request, so previous_response_id can continue it)."""
    body = response_body(p, gen, version)
    await keep_calls(svc, p, [gen], version)
    await commit_trace(svc, p, body, version, len(gen.token_ids),
                       request={**p.req.model_dump(exclude_none=True), "gymloop_messages": messages})
    return body


def _item_events(item: dict, index: int, text_shown: str) -> list[tuple[str, dict]]:
    """The events that finish output item `index` (whose text streamed so far is `text_shown`;
    an item not yet announced is announced first)."""
    ref = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        return [("response.output_item.added", {"output_index": index, "item": {**item, "arguments": "",
                                                                                 "status": "in_progress"}}),
                ("response.function_call_arguments.delta", {**ref, "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {**ref, "name": item["name"], "arguments": item["arguments"]}),
                ("response.output_item.done", {"output_index": index, "item": item})]
    part = item["content"][0]
    text = part["text"]
    events = [] if text_shown else _message_opened(item, index)
    if text.startswith(text_shown) and len(text) > len(text_shown):
        events.append(("response.output_text.delta", {**ref, "content_index": 0, "delta": text[len(text_shown):],
                                                      "logprobs": []}))
    return events + [
        ("response.output_text.done", {**ref, "content_index": 0, "text": text, "logprobs": []}),
        ("response.content_part.done", {**ref, "content_index": 0, "part": part}),
        ("response.output_item.done", {"output_index": index, "item": item})]


def _message_opened(item: dict, index: int) -> list[tuple[str, dict]]:
    return [("response.output_item.added", {"output_index": index, "item": {**item, "status": "in_progress",
                                                                            "content": []}}),
            ("response.content_part.added", {"output_index": index, "item_id": item["id"], "content_index": 0,
                                             "part": {"type": "output_text", "text": "", "annotations": [],
                                                      "logprobs": []}})]


async def stream_events(svc: Services, p: Prepared, messages: list[dict]) -> AsyncIterator[str]:
    """OpenAI's response events while the reply is generated: created, in_progress, the message's
    text deltas (text that may turn into a tool call held back), then each output item whole
    (function calls with their arguments) and `response.completed` once the trace is committed."""
    seq = itertools.count()

    def event(kind: str, fields: dict) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **fields})}\n\n"

    s = Streamed.submit(p)
    start = _envelope(p, p.batcher.version, "in_progress")
    yield event("response.created", {"response": start})
    yield event("response.in_progress", {"response": start})
    msg = {"type": "message", "id": "msg_" + p.cid[5:], "status": "in_progress", "role": "assistant",
           "content": [{"type": "output_text", "text": ""}]}
    opened = False
    async for _, delta in s.deltas(p):
        if not opened:
            if not s.shown[0].strip():
                continue                  # blank so far: the reply may be calls only, with no message
            opened, delta = True, s.shown[0]
            for kind, fields in _message_opened(msg, 0):
                yield event(kind, fields)
        yield event("response.output_text.delta", {"output_index": 0, "item_id": msg["id"], "content_index": 0,
                                                   "delta": delta, "logprobs": []})
    gen = (await s.results())[0]
    body = await _committed(svc, p, gen, s.rs[0].version, messages)
    for index, item in enumerate(body["output"]):
        shown = s.shown[0] if opened and item["type"] == "message" else ""
        for kind, fields in _item_events(item, index, shown):
            yield event(kind, fields)
    yield event("response.completed" if body["status"] == "completed" else "response.incomplete", {"response": body})


async def create(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    req: ResponseRequest = await svc.body(request, ResponseRequest)
    p, messages = await _prepare(svc, req, who)
    session_of(request, p)
    if req.stream:
        return StreamingResponse(stream_events(svc, p, messages), media_type="text/event-stream",
                                 headers={"x-gymloop-trace-id": p.cid})
    (gen,), version = await generate(p)
    body = await _committed(svc, p, gen, version, messages)
    return JSONResponse(body, headers={"x-gymloop-trace-id": p.cid, "x-gymloop-model-version": str(version)})


async def retrieve(response_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    trace = svc.store.traces.get(response_id)
    if trace is None or trace["key_id"] != who.key_id or trace["response"].get("object") != "response":
        raise APIError(404, f"No such response: {response_id}", param="response_id")
    return trace["response"]


def router(cfg: ServeConfig) -> APIRouter:
    """POST /v1/responses, GET /v1/responses/{id}; `cfg` shapes the documented schema."""
    r = APIRouter()
    r.add_api_route("/v1/responses", create, methods=["POST"], openapi_extra=json_body(ResponseRequest, {
        "model": {"enum": [cfg.served_name()]}, "max_output_tokens": {"maximum": cfg.max_tokens_limit}}),
        responses={200: {"description": "a response, or with stream: true a text/event-stream of its events",
                         "content": {"application/json": {}, "text/event-stream": {}}},
                   **error_responses(400, 401, 404, 413)})
    r.add_api_route("/v1/responses/{response_id}", retrieve, methods=["GET"], responses=error_responses(401, 404))
    return r
