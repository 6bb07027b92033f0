"""Merging an agent program's calls into training sequences (rollout/capture.py): a call that
continues the previous one is appended onto its exact sampled ids; one that rewrote its history
starts a segment; the comparison is by message, not by re-rendered text."""
from __future__ import annotations

import pytest

from gymloop.rollout.capture import Call, continues, merge, message_key, start

TOOLS = [{"type": "function", "function": {"name": "get_stock", "description": "d",
                                           "parameters": {"type": "object", "properties": {"item": {}}}}}]
SYSTEM = {"role": "system", "content": "You are a clerk."}
USER = {"role": "user", "content": "How many apple?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_a", "type": "function", "function": {"name": "get_stock", "arguments": '{"item": "apple"}'}}]}


def sampled(tok, text: str) -> list[int]:
    """Ids as the engine would sample them: the text, then the end-of-turn token."""
    return tok.encode(text) + [tok.eos_token_ids[0]]


def call(tok, messages, reply: dict, text: str, tools=TOOLS, ended=True) -> Call:
    ids = sampled(tok, text) if ended else tok.encode(text)
    return Call(messages=list(messages), tools=tools, prompt_ids=tok.prompt_ids(messages, tools=tools),
                token_ids=ids, logprobs=[-0.5] * len(ids), reply=reply, version=3, ended=ended)


def test_a_continuing_call_is_appended_onto_the_sampled_ids(tok):
    first = call(tok, [SYSTEM, USER], CALL, '<tool_call>{"name":"get_stock","arguments":{"item":"apple"}}</tool_call>')
    # the program sends the call back with other ids and respaced arguments: the same messages
    back = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_zz", "type": "function", "function": {"name": "get_stock", "arguments": '{"item":"apple"}'}}]}
    second = call(tok, [SYSTEM, USER, back, {"role": "tool", "tool_call_id": "call_zz", "content": "7"}],
                  {"role": "assistant", "content": "7"}, "7")
    (seg,) = merge([first, second], tok)
    # the sampled ids of both calls stand at every trained position, in order
    trained = [t for t, m in zip(seg.token_ids, seg.mask) if m]
    assert trained == first.token_ids + second.token_ids
    assert [lp for lp, m in zip(seg.logprobs, seg.mask) if m] == first.logprobs + second.logprobs
    assert seg.prompt_ids == first.prompt_ids and seg.calls == 2
    # between them, masked: the tool's result and the next assistant prompt, as the template renders them
    delta = tok.continuation_ids([SYSTEM, USER, CALL], second.messages[3:], tools=TOOLS)
    n1 = len(first.token_ids)
    assert seg.token_ids[n1:n1 + len(delta)] == delta and not any(seg.mask[n1:n1 + len(delta)])
    assert "7" in tok.decode(delta)


def test_a_rewritten_history_starts_a_segment(tok):
    first = call(tok, [SYSTEM, USER], {"role": "assistant", "content": "apples: 7"}, "apples: 7")
    # the program summarised the conversation instead of sending it back
    second = call(tok, [SYSTEM, {"role": "user", "content": "Summary: 7 apples. Answer with the number."}],
                  {"role": "assistant", "content": "7"}, "7")
    segs = merge([first, second], tok)
    assert len(segs) == 2
    assert segs[1].prompt_ids == second.prompt_ids and segs[1].token_ids == second.token_ids
    assert segs[1].mask == [1] * len(second.token_ids)


def test_what_breaks_a_continuation(tok):
    first = call(tok, [SYSTEM, USER], {"role": "assistant", "content": "apples"}, "apples")
    seg = start(first)
    follow = [SYSTEM, USER, {"role": "assistant", "content": "apples"}, {"role": "user", "content": "and?"}]
    assert continues(call(tok, follow, {"role": "assistant", "content": "7"}, "7"), seg)
    # other tools, another reply than the one returned, nothing new: no continuation
    assert not continues(call(tok, follow, {"role": "assistant", "content": "7"}, "7", tools=None), seg)
    other = follow[:2] + [{"role": "assistant", "content": "pears"}] + follow[3:]
    assert not continues(call(tok, other, {"role": "assistant", "content": "7"}, "7"), seg)
    assert not continues(call(tok, follow[:3], {"role": "assistant", "content": "7"}, "7"), seg)
    # a reply cut before its end-of-turn token (max_tokens) cannot be continued token-exactly
    cut = start(call(tok, [SYSTEM, USER], {"role": "assistant", "content": "apples"}, "apples", ended=False))
    assert not continues(call(tok, follow, {"role": "assistant", "content": "7"}, "7"), cut)


def test_a_branch_from_an_earlier_call_is_its_own_segment(tok):
    a = call(tok, [SYSTEM, USER], {"role": "assistant", "content": "apples"}, "apples")
    turn = [SYSTEM, USER, {"role": "assistant", "content": "apples"}]
    b = call(tok, turn + [{"role": "user", "content": "count them"}], {"role": "assistant", "content": "7"}, "7")
    c = call(tok, turn + [{"role": "user", "content": "and pears?"}], {"role": "assistant", "content": "3"}, "3")
    segs = merge([a, b, c], tok)
    assert [s.calls for s in segs] == [2, 1]
    assert segs[1].token_ids == c.token_ids


@pytest.mark.parametrize("a, b", [
    ({"role": "assistant", "content": None}, {"role": "assistant", "content": ""}),
    ({"role": "user", "content": [{"type": "input_text", "text": "hi "}, {"type": "input_text", "text": "there"}]},
     {"role": "user", "content": "hi there"}),
])
def test_messages_that_are_the_same(a, b):
    assert message_key(a) == message_key(b)
