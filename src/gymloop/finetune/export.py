"""From production to a training file: the store's traces with a verdict as the fine-tuning
API's formats (`gymloop traces export --format sft|dpo|rft`), so production's answers and
failures become the next job's data.

    sft   the conversations production got right (reward 1), answer included
    dpo   per prompt, its best answer against its worst, when their rewards differ
    rft   each distinct prompt once, with the task it came from (env, task_id) for a grader
"""
from __future__ import annotations

import json
from typing import Callable


def _prompt(trace: dict) -> tuple[list[dict], list | None]:
    req = trace["request"]
    msgs = [{"role": m["role"], "content": m.get("content") or ""} for m in req.get("messages", [])]
    return msgs, req.get("tools")


def _answer(trace: dict) -> str:
    return trace["response"]["choices"][0]["message"]["content"] or ""


def _key(trace: dict) -> str:
    """A prompt's identity: its task when feedback named one, else the messages themselves."""
    if trace["task_id"]:
        return f"{trace['env']}@{trace['env_version']}:{trace['task_id']}"
    return json.dumps(_prompt(trace), sort_keys=True)


def sft(traces: list[dict]) -> list[dict]:
    out = []
    for t in traces:
        if t["reward"] >= 1:
            msgs, tools = _prompt(t)
            out.append({"messages": msgs + [{"role": "assistant", "content": _answer(t)}], **({"tools": tools} if tools else {})})
    return out


def dpo(traces: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for t in traces:
        groups.setdefault(_key(t), []).append(t)
    out = []
    for group in groups.values():
        best = max(group, key=lambda t: t["reward"])
        worst = min(group, key=lambda t: t["reward"])
        if best["reward"] > worst["reward"] and _answer(best) != _answer(worst):
            msgs, tools = _prompt(best)
            out.append({"input": {"messages": msgs, **({"tools": tools} if tools else {})},
                        "preferred_output": [{"role": "assistant", "content": _answer(best)}],
                        "non_preferred_output": [{"role": "assistant", "content": _answer(worst)}]})
    return out


def rft(traces: list[dict]) -> list[dict]:
    seen, out = set(), []
    for t in traces:
        k = _key(t)
        msgs, tools = _prompt(t)
        if k in seen or not msgs or msgs[-1]["role"] not in ("user", "developer"):
            continue
        seen.add(k)
        out.append({"messages": msgs, **({"tools": tools} if tools else {}),
                    **({"env": t["env"], "env_version": t["env_version"], "task_id": t["task_id"]} if t["task_id"] else {})})
    return out


FORMATS: dict[str, Callable[[list[dict]], list[dict]]] = {"sft": sft, "dpo": dpo, "rft": rft}


def export(traces: list[dict], fmt: str) -> bytes:
    """The JSONL file of `fmt` (one example a line)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    rows = FORMATS[fmt](traces)
    return "".join(json.dumps(r) + "\n" for r in rows).encode()
