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

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.exceptions import AgentsException
from openai import AsyncOpenAI

INSTRUCTIONS = ('Call tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
                "Reply with the final number only.")
ITEMS = ("apple", "pear", "plum", "fig", "kiwi", "lime", "nut", "yam", "bean", "corn")


# The inventory service's APIs: version 1 (what nano-tools learnt) and the current one, whose tools
# and arguments were renamed. Each: (get tool, its argument), (add tool, its arguments), docs.
APIS = {
    1: (("get_stock", "item"), ("add_stock", "item", "count"),
        ("Units in stock of an item.", "Add units of an item; returns the new stock.")),
    3: (("lookup_item", "sku"), ("restock", "sku", "quantity"),
        ("Quantity on hand of a SKU.", "Receive units of a SKU; returns the new quantity.")),
}


def clerk(client: AsyncOpenAI, model: str, stock: dict[str, int], worked: list[str], api: int = 3) -> Agent:
    """The agent on inventory API `api`, its tools acting on this episode's `stock`; each call that
    worked is noted."""
    (get_name, key), (add_name, key2, amount), (get_doc, add_doc) = APIS[api]

    def get(**kw) -> str:
        name = kw[key]
        if name not in stock:
            return json.dumps({"error": f"unknown {key} {name!r}"})
        worked.append(get_name)
        return json.dumps({key: name, amount if api == 3 else "count": stock[name]})

    def add(**kw) -> str:
        name, n = kw[key2], kw[amount]
        if name not in stock or n < 0:
            return json.dumps({"error": f"cannot add {n} of {name!r}"})
        stock[name] += n
        worked.append(add_name)
        return json.dumps({key2: name, amount if api == 3 else "count": stock[name]})

    tools = [_tool(get_name, get_doc, get, {key: str}), _tool(add_name, add_doc, add, {key2: str, amount: int})]
    return Agent(name="inventory clerk", instructions=INSTRUCTIONS, tools=tools,
                 model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                 model_settings=ModelSettings(temperature=0, max_tokens=64))


def _tool(name: str, doc: str, fn, params: dict[str, type]):
    """A function tool named `name` whose arguments are `params` (what @function_tool writes for
    a function of that signature)."""
    from agents import FunctionTool

    schema = {"type": "object", "properties": {k: {"title": k.title(), "type": "string" if t is str else "integer"}
                                               for k, t in params.items()},
              "required": list(params), "title": f"{name}_args", "additionalProperties": False}

    async def invoke(ctx, arguments: str) -> str:
        try:
            kw = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return json.dumps({"error": "arguments are not JSON"})
        if set(kw) != set(params) or any(not isinstance(kw[k], t) for k, t in params.items()):
            return json.dumps({"error": f"{name} takes {sorted(params)}"})
        return fn(**kw)

    return FunctionTool(name=name, description=doc, params_json_schema=schema, on_invoke_tool=invoke)


async def run(task: dict, client: AsyncOpenAI, model: str, api: int = 3) -> dict:
    """One episode on the current API: the task's question, the agent's answer, the clerk's own
    check as the reward."""
    set_tracing_disabled(True)      # the SDK's tracing uploads to OpenAI; gymloop keeps the calls
    stock = {i: 0 for i in ITEMS} | {task["item"]: task["stock"]}
    worked: list[str] = []
    try:
        result = await Runner.run(clerk(client, model, stock, worked, api), task["question"], max_turns=3)
        answer = str(result.final_output)
    except AgentsException:         # a tool it does not have, or no answer in 3 turns: a failed attempt
        answer = ""
    numbers = re.findall(r"-?\d+", answer)
    right = bool(numbers) and int(numbers[-1]) == task["stock"] + task["add"]
    changed = stock[task["item"]] - task["stock"] == task["add"]
    reward = float(right and changed and bool(worked))
    return {"reward": reward, "components": {"right_number": float(right), "stock_as_asked": float(changed),
                                             "tool_worked": float(bool(worked))}}


async def run_v1(task: dict, client: AsyncOpenAI, model: str) -> dict:
    """The same clerk as it was deployed before the service renamed its tools (API version 1)."""
    return await run(task, client, model, api=1)


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
