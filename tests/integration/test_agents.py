"""Tool calling end to end: a real `gymloop serve` of a model that calls tools (conftest's
tool_model_dir, trained on the conversation examples/agents_sdk.py has), the official `openai`
client on chat completions and the Responses API, plain and streamed, and the OpenAI Agents SDK
running examples/agents_sdk.py unchanged; every turn a trace in the store."""
from __future__ import annotations

import asyncio
import json

import pytest

from conftest import CLERK_KEY as KEY
from conftest import agent_rows
ROW = agent_rows()[1]
TOOLS, (SYSTEM, QUESTION, CALLED, RESULT, ANSWER) = ROW["tools"], ROW["messages"]
RESPONSE_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture(scope="module")
def server(clerk):
    return clerk


@pytest.fixture()
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server["base"], api_key=KEY, max_retries=0)


def _calls(tool_calls) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


def test_chat_replies_with_tool_calls_and_continues_after_the_result(server, client):
    ask = dict(model="clerk", messages=[SYSTEM, QUESTION], tools=TOOLS, temperature=0, max_tokens=80)
    first = client.chat.completions.create(**ask)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert _calls(choice.message.tool_calls) == [("get_stock", {"item": "apple"})]
    stored = server["store"].traces.get(first.id)["response"]["choices"][0]["message"]["tool_calls"]
    assert stored == [c.model_dump() for c in choice.message.tool_calls]
    # the client sends the call back with its result, as any agent loop does
    call = choice.message.tool_calls[0]
    then = client.chat.completions.create(**{**ask, "messages": [
        SYSTEM, QUESTION, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "7"}]})
    assert then.choices[0].message.content == "7" and then.choices[0].finish_reason == "stop"
    # tool_choice "none": the same reply, as text
    text = client.chat.completions.create(**ask, tool_choice="none").choices[0]
    assert text.message.tool_calls is None and text.message.content.startswith("<tool_call>")


def test_streamed_tool_calls_arrive_whole_and_the_text_holds_no_call(server, client):
    chunks = list(client.chat.completions.create(model="clerk", messages=[SYSTEM, QUESTION], tools=TOOLS,
                                                  temperature=0, max_tokens=80, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert text == "" and _calls(deltas) == [("get_stock", {"item": "apple"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    stored = server["store"].traces.get(chunks[0].id)["response"]["choices"][0]["message"]["tool_calls"]
    assert stored[0]["id"] == deltas[0].id


def test_responses_api_function_calls_plain_and_streamed(server, client):
    first = client.responses.create(model="clerk", instructions=SYSTEM["content"], input=QUESTION["content"],
                                    tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=80)
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_stock", {"item": "apple"})
    # the function's output continues the conversation (previous_response_id), and the model answers
    second = client.responses.create(model="clerk", instructions=SYSTEM["content"], previous_response_id=first.id,
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "7"}],
                                     tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=80)
    assert second.output_text == "7"
    carried = server["store"].traces.get(second.id)["request"]["gymloop_messages"]
    assert carried[2]["tool_calls"][0]["function"] == {"name": "get_stock", "arguments": call.arguments}
    events = list(client.responses.create(model="clerk", instructions=SYSTEM["content"], input=QUESTION["content"],
                                          tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=80, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" not in kinds           # a call only: no message item
    done = events[-1].response
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert done.output[0].arguments == next(e.arguments for e in events
                                            if e.type == "response.function_call_arguments.done")
    assert client.responses.retrieve(done.id).output[0].call_id == done.output[0].call_id
    text = list(client.responses.create(model="clerk", instructions=SYSTEM["content"], previous_response_id=first.id,
                                        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "7"}],
                                        tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=80, stream=True))
    streamed = "".join(e.delta for e in text if e.type == "response.output_text.delta")
    assert streamed == text[-1].response.output_text == "7"


def _example():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import agents_sdk

    return agents_sdk


def test_the_agents_sdk_example_runs_unchanged_and_its_turns_are_traces(server):
    out = asyncio.run(_example().main(["--base-url", server["base"], "--api-key", KEY, "--model", "clerk"]))
    assert out["final_output"] == "7"
    assert out["tool_calls"] == [{"name": "get_stock", "arguments": {"item": "apple"}}]
    assert len(out["traces"]) == 2
    traces = [server["store"].traces.get(t) for t in out["traces"]]
    assert traces[0]["response"]["output"][0]["type"] == "function_call"
    assert traces[1]["response"]["output"][0]["content"][0]["text"] == "7"


def test_the_agents_sdk_streams_through_the_same_agent(server):
    from agents import Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    example = _example()

    async def run():
        set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=server["base"], api_key=KEY, max_retries=0)
        result = Runner.run_streamed(example.agent(client, "clerk"), QUESTION["content"], max_turns=4)
        kinds = [e.data.type async for e in result.stream_events() if e.type == "raw_response_event"]
        return result.final_output, kinds

    final, kinds = asyncio.run(run())
    assert final == "7" and kinds.count("response.completed") == 2
    assert "response.function_call_arguments.done" in kinds and "response.output_text.delta" in kinds



def test_production_episodes_read_the_calls_the_server_parsed():
    """Simulated production (jobs/traffic.py) with tools in the request: a server answers a call
    with `tool_calls` and no content, and the episode's verifier must still see the call."""
    from types import SimpleNamespace

    from openai.types.chat import ChatCompletion

    from gymloop.envs import make_env
    from gymloop.demos.traffic import api_episode

    env = make_env("calls@v2", heldout="requests")
    task = env.sample_tasks(1, "train", 0)[0]
    call = {"id": "call_0", "type": "function", "function": {
        "name": task.answer["name"], "arguments": json.dumps(task.answer["arguments"])}}
    completion = ChatCompletion.model_validate({
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}})
    sent = []

    def create(**kw):
        sent.append(kw)
        return SimpleNamespace(headers={"x-gymloop-trace-id": "tr", "x-gymloop-model-version": "3"},
                               parse=lambda: completion)

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(
        with_raw_response=SimpleNamespace(create=create))))
    assert api_episode(client, "m", env, task, max_tokens=48, max_turns=1) == (1.0, "tr", [3], 7)
    assert sent[0]["tools"] == env.tools(task)
