"""Training files of the fine-tuning API, validated when uploaded: JSONL, one example a line,
in the format of its method. A bad file is kept with `status: "error"` and a message naming its
first bad line, so a user fixes the file, not a guess.

    supervised     {"messages": [...], "tools"?: [...]}      >= 1 assistant message; an
                   assistant message may carry "weight": 0 | 1 (0: not trained on)
    dpo            {"input": {"messages": [...], "tools"?}, "preferred_output": [assistant msg],
                    "non_preferred_output": [assistant msg]}  (or *_completion, the older names)
    reinforcement  {"messages": [... ending with a user or developer turn], <fields for graders>}
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_LINE_BYTES = 1 << 20


class FormatError(ValueError):
    """A file or a line that is not a training example; the message names the line."""


@dataclass(frozen=True)
class Parsed:
    kind: str                 # "supervised", "dpo" or "reinforcement"
    rows: list[dict]


def _messages(value: Any, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise FormatError(f"{where} must be a non-empty list of messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise FormatError(f"{where}[{i}] is not an object")
        role = m.get("role")
        if role not in ROLES:
            raise FormatError(f"{where}[{i}]: unknown role {role!r} (expected one of {', '.join(sorted(ROLES))})")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise FormatError(f"{where}[{i}]: content must be a string")
        if content is None and not m.get("tool_calls"):
            raise FormatError(f"{where}[{i}]: no content")
        if "weight" in m and (role != "assistant" or m["weight"] not in (0, 1)):
            raise FormatError(f"{where}[{i}]: weight must be 0 or 1, on assistant messages only")
    return value


def _supervised(row: dict) -> dict:
    msgs = _messages(row.get("messages"), "messages")
    if not any(m["role"] == "assistant" for m in msgs):
        raise FormatError("no assistant message to train on")
    return row


def _output(row: dict, name: str) -> list[dict]:
    value = row.get(f"{name}_output", row.get(f"{name}_completion"))
    if value is None:
        raise FormatError(f"missing {name}_output")
    msgs = _messages(value, f"{name}_output")
    if any(m["role"] != "assistant" for m in msgs):
        raise FormatError(f"{name}_output must hold assistant messages only")
    return msgs


def _dpo(row: dict) -> dict:
    inp = row.get("input")
    if not isinstance(inp, dict):
        raise FormatError("missing input (an object with messages)")
    msgs = _messages(inp.get("messages"), "input.messages")
    return {"input": {**inp, "messages": msgs}, "preferred_output": _output(row, "preferred"),
            "non_preferred_output": _output(row, "non_preferred")}


def _reinforcement(row: dict) -> dict:
    msgs = _messages(row.get("messages"), "messages")
    if msgs[-1]["role"] not in ("user", "developer"):
        raise FormatError("the last message must be a user or developer turn (the model answers it)")
    return row


CHECKS: dict[str, Callable[[dict], dict]] = {"supervised": _supervised, "dpo": _dpo,
                                             "reinforcement": _reinforcement}


def detect(row: dict) -> str:
    """The method a row's keys say it is for."""
    if "input" in row or any(k.endswith(("_output", "_completion")) for k in row):
        return "dpo"
    msgs = row.get("messages")
    if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict) and msgs[-1].get("role") == "assistant":
        return "supervised"
    return "reinforcement" if isinstance(msgs, list) and msgs else "supervised"


def parse(data: bytes, kind: str | None = None, max_rows: int = 1_000_000) -> Parsed:
    """Every line of a JSONL training file as `kind` (detected from the first line when None).
    Raises FormatError("line N: ...") at the first bad line."""
    if not data.strip():
        raise FormatError("the file is empty")
    rows: list[dict] = []
    for n, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE_BYTES:
            raise FormatError(f"line {n}: longer than {MAX_LINE_BYTES} bytes")
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(f"line {n}: not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
        if not isinstance(row, dict):
            raise FormatError(f"line {n}: not a JSON object")
        kind = kind or detect(row)
        try:
            rows.append(CHECKS[kind](row))
        except FormatError as exc:
            raise FormatError(f"line {n}: {exc} (a {kind} example)") from None
        if len(rows) > max_rows:
            raise FormatError(f"more than {max_rows} examples")
    return Parsed(kind, rows)
