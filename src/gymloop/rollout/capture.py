"""Token capture of an agent program's model calls, and their merge into training sequences.

Every call an episode makes is recorded with the exact ids the engine saw and sampled (`Call`).
At the end of the episode `merge` rebuilds the calls into as few token sequences as it can:

- a call *continues* an earlier one when its messages begin with that call's messages followed
  by the reply gymloop returned for it, compared as messages (role, content, tool calls' names
  and arguments; `None` and `""` alike; call ids ignored), never as re-rendered text, so a chat
  template that renders a turn differently the second time cannot break the match;
- a continuing call is appended onto the earlier call's sequence: the *sampled* ids stand where
  the re-rendered assistant turn would be, what the program added after it (tool results, user
  turns) is rendered as a delta by the chat template and masked out of the loss, then the new
  call's sampled ids follow;
- a call that continues none (the program summarised, truncated or rewrote its history, or the
  earlier reply was cut before its end-of-turn token) starts a new segment: its own prompt ids,
  trained as a sequence of its own with the episode's advantage.

Nothing the model produced is ever re-tokenized.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..models.chat import ChatTokenizer
from .episodes import Segment


@dataclass
class Call:
    """One choice of one model call, as the engine ran it.

    messages: the conversation the program sent (chat messages; a Responses request's items
    already turned into them); prompt_ids: their rendering, as generated from; token_ids /
    logprobs: the sampled ids and their behaviour log-probs; reply: the assistant message the
    program was answered with; ended: the sample ended on an end-of-turn token.
    """

    messages: list[dict]
    tools: list[dict] | None
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    reply: dict
    version: int
    ended: bool


def start(call: Call) -> Segment:
    """A segment opened by `call`: its prompt ids, then its sampled ids."""
    seg = Segment(prompt_ids=list(call.prompt_ids), tools=call.tools)
    _sampled(seg, call)
    return seg


def _sampled(seg: Segment, call: Call) -> None:
    seg.token_ids += call.token_ids
    seg.mask += [1] * len(call.token_ids)
    seg.logprobs += call.logprobs
    seg.messages = list(call.messages) + [call.reply]
    seg.ended, seg.calls = call.ended, seg.calls + 1


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def message_key(m: dict) -> tuple:
    """What of a message decides whether two conversations are the same: its role, its content
    (`None` and `""` alike; text parts joined), its tool calls' names and arguments (as JSON values,
    so `{"a": 1}` and `{"a":1}` agree). Call ids are the program's bookkeeping, not the model's."""
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = tuple((c.get("function", {}).get("name"), json.dumps(_arguments(c.get("function", {}).get("arguments")),
                                                                  sort_keys=True))
                  for c in m.get("tool_calls") or ())
    return m.get("role"), content or "", calls


def continues(call: Call, seg: Segment) -> bool:
    """Whether `call` picks up where `seg` left off: the same tools, and its messages begin with
    the segment's conversation (its last reply included), with something after it."""
    if not seg.ended or (call.tools or None) != (seg.tools or None):
        return False
    n = len(seg.messages)
    return len(call.messages) > n and all(message_key(a) == message_key(b)
                                          for a, b in zip(call.messages[:n], seg.messages))


def merge(calls: Sequence[Call], tok: ChatTokenizer) -> list[Segment]:
    """The episode's calls, in the order they were answered, as training segments (see the
    module docstring). A call extends the newest segment it continues; one that continues none
    starts a segment."""
    segments: list[Segment] = []
    for call in calls:
        seg = next((s for s in reversed(segments) if continues(call, s)), None)
        if seg is None:
            segments.append(start(call))
            continue
        added = call.messages[len(seg.messages):]
        try:
            delta = tok.continuation_ids(seg.messages, added, tools=call.tools)
        except ValueError:              # a template that does not render prefixes as prefixes
            segments.append(start(call))
            continue
        seg.token_ids += delta
        seg.mask += [0] * len(delta)
        seg.logprobs += [0.0] * len(delta)
        _sampled(seg, call)
    return segments
