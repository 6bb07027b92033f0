"""The one tool format (models/toolcalls.py): schemas and calls rendered for any chat template
(SmolLM2's, which knows no tools; nano's, which renders schemas itself; a template that renders
`tool_calls` itself), replies parsed back into OpenAI tool calls, and the training tokens of a
function-calling SFT row equal to the serving prompt plus the reply."""
from __future__ import annotations

import json

import pytest

from gymloop.bases import smollm2
from gymloop.finetune.examples import sft_example
from gymloop.finetune.formats import parse as parse_file
from gymloop.models.chat import ChatTokenizer, build_char_tokenizer
from gymloop.models.toolcalls import (TemplateSupport, for_template, parse_tool_calls, reply_message,
                                      tool_response, visible_text)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
# OpenAI's function-calling fine-tuning format: an assistant message with tool_calls and no content
ROW = {"tools": [WEATHER], "messages": [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp_c": 21}'},
    {"role": "assistant", "content": "21 degrees."}]}


@pytest.fixture(scope="module")
def smol_tok() -> ChatTokenizer:
    if smollm2.available():
        pytest.skip(smollm2.available())
    return smollm2.tokenizer()


def test_smollm2_template_knows_no_tools_so_the_format_puts_them_in_the_system_message(smol_tok):
    assert TemplateSupport.of(smol_tok.hf.chat_template) == TemplateSupport(tools=False, tool_calls=False)
    text = smol_tok.render(ROW["messages"], add_generation_prompt=False, tools=ROW["tools"])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a weather bot.\n\n# Tools")
    assert json.dumps(WEATHER) in system
    assert ('<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
            "</tool_call><|im_end|>") in text
    assert '<|im_start|>tool\n<tool_response>{"temp_c": 21}</tool_response><|im_end|>' in text
    # without a system message, the tools block is one (SmolLM2's default system prompt is replaced)
    alone = smol_tok.render(ROW["messages"][1:2], tools=ROW["tools"])
    assert alone.startswith("<|im_start|>system\n# Tools") and "SmolLM" not in alone


def test_an_sft_row_trains_on_exactly_the_serving_prompt_and_the_reply(smol_tok):
    """The tokens a supervised job trains on for the tool-call turn are the tokens the server
    prompts with, then the reply the server parses back into the row's call."""
    (row,) = parse_file(json.dumps(ROW).encode(), "supervised").rows
    ids, mask = sft_example(smol_tok, row)
    prompt = smol_tok.prompt_ids(ROW["messages"][:2], tools=ROW["tools"])     # what serving renders
    assert ids[:len(prompt)] == prompt and not any(mask[:len(prompt)])
    reply = []
    for t, m in zip(ids[len(prompt):], mask[len(prompt):]):
        if not m:
            break
        reply.append(t)
    assert reply[-1] in smol_tok.eos_token_ids                                # the turn ends as served
    content, calls = reply_message(smol_tok.decode(reply))
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    # the second assistant turn is trained too, after the rendered tool result
    trained = smol_tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert trained.endswith("</tool_call><|im_end|>21 degrees.<|im_end|>")


def test_nano_renders_the_schemas_itself_and_results_as_before(tok):
    assert TemplateSupport.of(tok.hf.chat_template) == TemplateSupport(tools=True, tool_calls=False)
    text = tok.render(ROW["messages"], add_generation_prompt=False, tools=ROW["tools"])
    assert text.startswith("<|system|>get_weather(city)<|end|><|system|>You are a weather bot.<|end|>")
    assert '<|tool|><tool_response>{"temp_c": 21}</tool_response><|end|>' in text
    # a result an older environment wrapped itself is not wrapped twice
    old = [{"role": "tool", "content": '<tool_response>{"a": 1}</tool_response>'}]
    assert tok.render(old, add_generation_prompt=False) == tok.render(
        [{"role": "tool", "content": tool_response({"a": 1})}], add_generation_prompt=False)


def test_a_template_that_renders_tool_calls_gets_them_with_object_arguments():
    native = ChatTokenizer(build_char_tokenizer())
    native.hf.chat_template = (
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }}"
        "{{ c.function.arguments.city }};{% endfor %}{% else %}{{ m.role }}:{{ m.content }};{% endif %}{% endfor %}")
    msgs, tools = for_template(ROW["messages"], ROW["tools"], TemplateSupport(tools=True, tool_calls=True))
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"} and tools == ROW["tools"]
    assert "CALL get_weatherParis;tool:{\"temp_c\": 21};" in native.render(ROW["messages"], add_generation_prompt=False)


def test_replies_parse_into_calls_and_text():
    content, calls = reply_message('Let me look.\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
                                   '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert content == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("f", {"x": 1}),
                                                                                                ("g", {"y": 2})]
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)
    # a malformed call is text: nothing is called that the model did not write whole
    broken = '<tool_call>{"name": "f", "arguments": {"x": </tool_call>'
    assert reply_message(broken) == (broken, [])
    assert parse_tool_calls(broken).errors and reply_message("plain answer") == ("plain answer", [])


@pytest.mark.parametrize("text, shown", [
    ("Hello", "Hello"), ("Hi <tool_call>{", "Hi "), ("Hi <tool", "Hi "), ("a < b", "a < b"), ("x<", "x"),
    ("", "")])
def test_a_stream_holds_back_what_may_become_a_call(text, shown):
    assert visible_text(text) == shown
