"""Tools in the prompt and tool calls in the reply: the one format every part of gymloop uses.

Serving (a request's `tools`, an assistant's `tool_calls`, `role: "tool"` results), fine-tuning
rows in OpenAI's function-calling format, RL episodes and the gym's tool environments all render
through `for_template` (called by `ChatTokenizer.render`) and read replies with `parse_tool_calls`,
so a model is trained on exactly the tokens it is served with.

A chat template that renders OpenAI tools itself (its source names `tools`) is given the schemas;
one that does not (SmolLM2's) gets them in the system message, in the Hermes format that Qwen2.5,
Hermes and most open tool-calling models were trained on (`TOOLS_PROMPT`). A template that renders
an assistant's `tool_calls` itself is given them (arguments as objects, as Hugging Face templates
expect); for one that does not, each call becomes a block of the assistant's text

    <tool_call>{"name": "get_stock", "arguments": {"item": "apple"}}</tool_call>

and a tool's result the tool message's text inside <tool_response>...</tool_response>.
`parse_tool_calls` reads replies back and never raises on model output: every malformed call
becomes an error string that an environment turns into an error observation for the model.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Sequence

MAX_CHARS = 32_768          # longer replies are cut before parsing (bounded work per turn)
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)

# The Hermes tool prompt (as Qwen2.5's template writes it), with gymloop's one-line call format.
TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>{{"name": <function-name>, "arguments": <args-json-object>}}'
    "</tool_call>")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict | str     # a string only for arguments that are not JSON (an earlier turn as written)


@dataclass
class Parsed:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    text: str = ""            # the reply with the tool-call blocks removed


def _arguments(obj: dict, out: Parsed) -> dict | None:
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            out.errors.append(f"arguments of {obj['name']!r} are not a JSON object")
            return None
    if not isinstance(args, dict):
        out.errors.append(f"arguments of {obj['name']!r} must be a JSON object")
        return None
    return args


def parse_tool_calls(reply: str) -> Parsed:
    """The calls in a reply (in order), what was malformed, and the text around them."""
    out = Parsed()
    reply = reply[:MAX_CHARS]
    out.text = _CALL.sub("", reply).strip()
    for m in _CALL.finditer(reply):
        body, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            out.errors.append("unclosed <tool_call>: expected </tool_call>")
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            out.errors.append(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.errors.append('tool call must be a JSON object with a string "name"')
            continue
        args = _arguments(obj, out)
        if args is not None:
            out.calls.append(ToolCall(obj["name"], args))
    return out


def format_call(name: str, arguments: dict) -> str:
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CALL_CLOSE}"


def tool_response(payload: object) -> str:
    """A tool's result as the text of a tool message (JSON); the template wraps it."""
    return json.dumps(payload)


# --- OpenAI messages <-> what a template renders -------------------------------------------------
def openai_tool_calls(calls: Sequence[ToolCall]) -> list[dict]:
    """Parsed calls as OpenAI's `tool_calls` (arguments a JSON string, a fresh id each)."""
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]


def _call_of(tc: dict) -> ToolCall:
    """An OpenAI tool call (arguments a JSON string or an object) as a ToolCall; arguments that
    are not JSON (a model may have written them) are kept as the string they are."""
    fn = tc.get("function", tc)
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return ToolCall(fn["name"], args)


def _schema(tool: dict) -> dict:
    """A tool as {"type": "function", "function": {..., "parameters"}}: a flat one (the Responses
    API's) nested, and parameters without properties given an empty object's, so every template
    can read them."""
    fn = dict(tool.get("function", {k: v for k, v in tool.items() if k != "type"}))
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    fn["parameters"] = {"type": "object", **params, "properties": params.get("properties") or {}}
    return {"type": "function", "function": fn}


def call_text(content: str | None, tool_calls: Sequence[dict]) -> str:
    """An assistant turn with `tool_calls` as the text a model writes: its content, then a block a call."""
    blocks = [format_call(c.name, c.arguments) for c in map(_call_of, tool_calls)]
    return "\n".join(([content] if content else []) + blocks)


def _wrapped(content: str) -> str:
    # a result already inside the tags (as gymloop's environments wrote them before) is kept as is
    if content.startswith(RESPONSE_OPEN) and content.endswith(RESPONSE_CLOSE):
        return content
    return f"{RESPONSE_OPEN}{content}{RESPONSE_CLOSE}"


def tools_prompt(tools: Sequence[dict]) -> str:
    return TOOLS_PROMPT.format(schemas="\n".join(json.dumps(t) for t in tools))


@dataclass(frozen=True)
class TemplateSupport:
    """What a chat template renders itself."""

    tools: bool               # the `tools` schemas
    tool_calls: bool          # assistant `tool_calls` and tool results

    @classmethod
    def of(cls, template: str | None) -> "TemplateSupport":
        source = template or ""
        return cls(tools="tools" in source, tool_calls="tool_calls" in source)


def for_template(messages: Sequence[dict], tools: Sequence[dict] | None,
                 support: TemplateSupport) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) to hand a chat template: OpenAI messages as the template can render them.

    Content that is None becomes "" (templates concatenate it). Without template support: calls
    become <tool_call> blocks in the assistant's text, tool results are wrapped in
    <tool_response>, and the schemas go into the system message (a new one first when there is
    none) and are not passed to the template.
    """
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls") and not support.tool_calls:
            m["content"] = call_text(m.get("content"), m.pop("tool_calls"))
        elif m.get("tool_calls"):
            m["tool_calls"] = [{"type": "function", "id": tc.get("id"),
                                "function": {"name": c.name, "arguments": c.arguments}}
                               for tc, c in zip(m["tool_calls"], map(_call_of, m["tool_calls"]))]
        if m.get("content") is None:
            m["content"] = ""
        if m["role"] == "tool" and not support.tool_calls:
            m = {"role": "tool", "content": _wrapped(m["content"])}
        out.append(m)
    tools = [_schema(t) for t in tools or ()]
    if not tools or support.tools:
        return out, tools or None
    block = tools_prompt(tools)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out, None


def reply_message(text: str) -> tuple[str | None, list[dict]]:
    """A model's reply to a request with tools as OpenAI's (content, tool_calls): the well-formed
    calls, and the text around them (None when there is none). A reply with a malformed call is
    text only: nothing is called that the model did not write whole."""
    parsed = parse_tool_calls(text)
    if not parsed.calls or parsed.errors:
        return text, []
    return parsed.text or None, openai_tool_calls(parsed.calls)


def visible_text(text: str) -> str:
    """The part of a reply being generated that is surely not a tool call: what a stream may show
    before the reply is whole (up to a <tool_call>, and not a tail that may begin one)."""
    at = text.find(CALL_OPEN)
    if at >= 0:
        return text[:at]
    for k in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-k:]):
            return text[:-k]
    return text
