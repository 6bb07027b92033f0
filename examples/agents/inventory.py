"""An inventory clerk written with the OpenAI Agents SDK, as a team would deploy it, trained by
gymloop unchanged: `gymloop train configs/agent-inventory.yaml` runs `run` once per episode with
an `AsyncOpenAI` client bound to the policy being trained, and trains on the exact tokens of the
calls the SDK makes. Its reward is the clerk's own check: the right number, the stock changed
exactly as asked, and at least one tool call that worked (a right number without one is a guess).

The tools are the inventory service's current API (`lookup_item(sku)`, `restock(sku, quantity)`),
renamed from the one the `nano-tools` base learnt (`get_stock(item)`, `add_stock(item, count)`):
the base mostly calls the old names, which this agent does not have.

Run it against any OpenAI-compatible server too (`gymloop serve --model nano-tools ...`):

    python examples/agents/inventory.py --base-url http://127.0.0.1:8000/v1 --model gymloop-nano-tools
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import AgentsException
from openai import AsyncOpenAI

INSTRUCTIONS = ('Call tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
                "Reply with the final number only.")
ITEMS = ("apple", "pear", "plum", "fig", "kiwi", "lime", "nut", "yam", "bean", "corn")


def clerk(client: AsyncOpenAI, model: str, stock: dict[str, int], worked: list[str]) -> Agent:
    """The agent, its tools acting on this episode's `stock`; each call that worked is noted."""

    @function_tool
    def lookup_item(sku: str) -> str:
        """Quantity on hand of a SKU."""
        if sku not in stock:
            return json.dumps({"error": f"unknown sku {sku!r}"})
        worked.append("lookup_item")
        return json.dumps({"sku": sku, "quantity": stock[sku]})

    @function_tool
    def restock(sku: str, quantity: int) -> str:
        """Receive units of a SKU; returns the new quantity."""
        if sku not in stock or quantity < 0:
            return json.dumps({"error": f"cannot restock {quantity} of {sku!r}"})
        stock[sku] += quantity
        worked.append("restock")
        return json.dumps({"sku": sku, "quantity": stock[sku]})

    return Agent(name="inventory clerk", instructions=INSTRUCTIONS, tools=[lookup_item, restock],
                 model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                 model_settings=ModelSettings(temperature=0, max_tokens=64))


async def run(task: dict, client: AsyncOpenAI, model: str) -> dict:
    """One episode: the task's question, the agent's answer, the clerk's own check as the reward."""
    set_tracing_disabled(True)      # the SDK's tracing uploads to OpenAI; gymloop keeps the calls
    stock = {i: 0 for i in ITEMS} | {task["item"]: task["stock"]}
    worked: list[str] = []
    try:
        result = await Runner.run(clerk(client, model, stock, worked), task["question"], max_turns=3)
        answer = str(result.final_output)
    except AgentsException:         # a tool it does not have, or no answer in 3 turns: a failed attempt
        answer = ""
    numbers = re.findall(r"-?\d+", answer)
    right = bool(numbers) and int(numbers[-1]) == task["stock"] + task["add"]
    changed = stock[task["item"]] - task["stock"] == task["add"]
    reward = float(right and changed and bool(worked))
    return {"reward": reward, "components": {"right_number": float(right), "stock_as_asked": float(changed),
                                             "tool_worked": float(bool(worked))}}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="sk-local")
    ap.add_argument("--model", default="gymloop-nano-tools")
    ap.add_argument("--tasks", default="examples/agents/inventory-tasks.jsonl")
    ap.add_argument("--split", default="heldout")
    args = ap.parse_args()
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
    tasks = [json.loads(line) for line in open(args.tasks)]
    rewards = [(await run(t, client, args.model))["reward"] for t in tasks if t.get("split", "train") == args.split]
    print(json.dumps({"tasks": len(rewards), "mean_reward": sum(rewards) / max(len(rewards), 1)}))


if __name__ == "__main__":
    asyncio.run(main())
