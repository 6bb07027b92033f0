"""An OpenAI Agents SDK agent with two function tools, run against `gymloop serve` unchanged: the
SDK speaks the Responses API, gymloop renders the tools into the model's prompt and answers a
reply that calls one with a `function_call` item; the SDK runs the tool and sends its output back.
Every turn is a trace in gymloop's store (the ids printed are the trace ids).

    gymloop serve --model nano-tools --port 8000 --api-key sk-local --db agent.db &
    python examples/agents_sdk.py --base-url http://127.0.0.1:8000/v1 --api-key sk-local

The tools are the inventory of gymloop's `tools` environment (its v1 API), so `nano-tools`, the
small base pre-trained on that environment's transcripts, can act as the agent.
"""
from __future__ import annotations

import argparse
import asyncio
import json

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

STOCK = {"apple": 7, "pear": 3, "plum": 0}
INSTRUCTIONS = ('Call tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
                "Reply with the final number only.")


@function_tool
def get_stock(item: str) -> int:
    """Units in stock of an item."""
    return STOCK[item]


@function_tool
def add_stock(item: str, count: int) -> int:
    """Add units of an item; returns the new stock."""
    STOCK[item] += count
    return STOCK[item]


def agent(client: AsyncOpenAI, model: str) -> Agent:
    return Agent(name="stock clerk", instructions=INSTRUCTIONS, tools=[get_stock, add_stock],
                 model=OpenAIResponsesModel(model=model, openai_client=client),
                 model_settings=ModelSettings(temperature=0, max_tokens=128))


async def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="sk-local")
    ap.add_argument("--model", default="gymloop-nano-tools", help="the served model's id (see GET /v1/models)")
    ap.add_argument("--question", default="How many apple are in stock?")
    args = ap.parse_args(argv)
    set_tracing_disabled(True)       # the SDK's own tracing uploads to OpenAI; gymloop's store keeps the traces
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
    result = await Runner.run(agent(client, args.model), args.question, max_turns=4)
    calls = [{"name": item.raw_item.name, "arguments": json.loads(item.raw_item.arguments)}
             for item in result.new_items if item.type == "tool_call_item"]
    out = {"final_output": result.final_output, "tool_calls": calls,
           "traces": [r.response_id for r in result.raw_responses]}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    asyncio.run(main())
