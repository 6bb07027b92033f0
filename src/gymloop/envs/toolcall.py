"""Tool calls in the Hermes/Qwen format real chat models emit.

    <tool_call>{"name": "get_stock", "arguments": {"item": "apple"}}</tool_call>

`parse_tool_calls` never raises on model output: every malformed call becomes an error
string that the environment turns into an error observation for the model.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

MAX_CHARS = 32_768          # longer replies are cut before parsing (bounded work per turn)
_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass
class Parsed:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    text: str = ""            # the reply with the tool-call blocks removed


def parse_tool_calls(reply: str) -> Parsed:
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
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models emit the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                out.errors.append(f"arguments of {obj['name']!r} are not a JSON object")
                continue
        if not isinstance(args, dict):
            out.errors.append(f"arguments of {obj['name']!r} must be a JSON object")
            continue
        out.calls.append(ToolCall(obj["name"], args))
    return out


def format_call(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def tool_response(payload: object) -> str:
    return f"<tool_response>{json.dumps(payload)}</tool_response>"
