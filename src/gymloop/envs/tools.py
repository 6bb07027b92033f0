"""`tools`: multi-turn tool use over a simulated inventory service with a versioned API.

The weekly tool updates: version 2 changes the result format (`{"item", "count"}` became
`{"sku", "quantity"}`; the tools and their arguments are unchanged), version 3 also renames
the tools and their arguments (`get_stock(item)` became `lookup_item(sku)`,
`add_stock(item, count)` became `restock(sku, quantity)`). The tool schemas are given in the
prompt through the chat template's `tools` (as real agent prompts get them), so a model that
reads them can adapt; one that memorised v1 fails. The version is a config value, part of the
environment's name (`tools@v2`) and recorded in every task and score.

An episode succeeds when the final reply is the right number, the stock changed exactly as asked,
and at least one tool call was valid (the stock can only be known from a tool result, so a right
number without one is a guess, scored 0).

State is never kept between calls: the inventory of an episode is replayed from the task's
initial stock and the valid calls in the messages, so the environment can run anywhere.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .arith import parse_answer
from .base import Environment, Message, Score, Split, StepResult, Task, sample_distinct, split_of
from ..models.toolcalls import ToolCall, format_call, parse_tool_calls, tool_response

ITEMS = ("apple", "pear", "plum", "fig", "kiwi", "lime", "nut", "yam", "bean", "corn")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    args: tuple[str, ...]            # (item arg, count arg) names in this version
    kind: Literal["get", "add"]
    doc: str


_V1 = {"get_stock": ToolSpec("get_stock", ("item",), "get", "Units in stock of an item."),
       "add_stock": ToolSpec("add_stock", ("item", "count"), "add", "Add units of an item; returns the new stock.")}
API: dict[int, dict[str, ToolSpec]] = {
    1: _V1,
    2: _V1,                     # same tools; only the result format changed
    3: {"lookup_item": ToolSpec("lookup_item", ("sku",), "get", "Quantity on hand of a SKU."),
        "restock": ToolSpec("restock", ("sku", "quantity"), "add", "Receive units of a SKU; returns the new quantity.")},
}


def _result(version: int, item: str, count: int) -> dict:
    return {"item": item, "count": count} if version == 1 else {"sku": item, "quantity": count}


def schema(version: int) -> list[dict]:
    """OpenAI-style function schemas of a version's tools."""
    out = []
    for spec in API[version].values():
        props = {spec.args[0]: {"type": "string"}}
        if len(spec.args) > 1:
            props[spec.args[1]] = {"type": "integer"}
        out.append({"type": "function", "function": {
            "name": spec.name, "description": spec.doc,
            "parameters": {"type": "object", "properties": props, "required": list(spec.args)}}})
    return out


class ToolsConfig(BaseModel):
    """The tools environment."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1, 2, 3] = Field(1, description="Tool API version (2: new result format; 3: also "
                                      "renamed tools and arguments).")
    max_add: int = Field(3, ge=0, le=9, description="Largest number of units a task asks to add.")
    heldout_fraction: float = Field(0.2, gt=0, lt=1, description="Share of problems kept for evaluation.")
    schemas: bool = Field(True, description="Give the tool schemas in the prompt (the chat template's "
                          "`tools`). False: the agent must know its tools, as a fine-tuned production agent "
                          "with a short prompt does; nothing in the prompt then changes with the version, so a "
                          "renamed tool (v3) breaks old behaviour by construction.")


class ToolsEnv(Environment):
    def __init__(self, config: ToolsConfig | None = None) -> None:
        self.config = config or ToolsConfig()
        self.api = API[self.config.version]

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"tools@v{self.config.version}"

    # --- tasks ------------------------------------------------------------------------
    def _system(self) -> str:
        # The schemas themselves go through the chat template (`tools`), as real agents get them.
        return ('Call tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
                "Reply with the final number only.")

    def tools(self, task: Task) -> list[dict]:
        return schema(task.info.get("version", self.config.version)) if self.config.schemas else []

    def draw(self, rng: random.Random, split: Split) -> Task:
        while True:
            item, start = rng.choice(ITEMS), rng.randint(0, 9)
            add = rng.randint(0, self.config.max_add)
            # The split hashes the problem, not the version: v1 and v2 share held-out problems.
            if split_of(f"{item}:{start}:{add}", self.config.heldout_fraction) == split:
                return self._task(item, start, add, split)

    def _task(self, item: str, start: int, add: int, split: Split) -> Task:
        question = (f"How many {item} are in stock?" if add == 0
                    else f"Add {add} {item}, then tell me how many {item} are in stock.")
        return Task(id=f"{self.name}:{item}:{start}:{add}", env=self.name,
                    prompt=({"role": "system", "content": self._system()},
                            {"role": "user", "content": question}),
                    answer=start + add, split=split,
                    info={"item": item, "stock": start, "add": add, "version": self.config.version})

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        rng = random.Random(f"tools|{split}|{seed}")
        space = len(ITEMS) * 10 * (self.config.max_add + 1)
        return sample_distinct(self.draw, n, split, rng, space, self.config.heldout_fraction)

    def task_from_id(self, task_id: str) -> Task:
        try:
            _, item, start, add = task_id.split(":")
            start_i, add_i = int(start), int(add)
        except ValueError:
            raise ValueError(f"not a tools task id: {task_id!r}") from None
        if item not in ITEMS:
            raise ValueError(f"not a tools task id: {task_id!r}")
        return self._task(item, start_i, add_i, split_of(f"{item}:{start_i}:{add_i}", self.config.heldout_fraction))

    # --- episode ----------------------------------------------------------------------
    def _call(self, stock: dict[str, int], call: ToolCall) -> tuple[dict, bool]:
        """Execute one call against `stock` (mutated). Returns (payload, valid)."""
        spec = self.api.get(call.name)
        if spec is None:
            return {"error": f"unknown tool {call.name!r}; available: {sorted(self.api)}"}, False
        missing = [a for a in spec.args if a not in call.arguments]
        extra = sorted(set(call.arguments) - set(spec.args))
        if missing or extra:
            return {"error": f"{spec.name} takes arguments {list(spec.args)}; missing {missing}, unexpected {extra}"}, False
        item = call.arguments[spec.args[0]]
        if not isinstance(item, str) or item not in stock:
            return {"error": f"unknown {spec.args[0]} {item!r}"}, False
        if spec.kind == "add":
            n = call.arguments[spec.args[1]]
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                return {"error": f"{spec.args[1]} must be a non-negative integer"}, False
            stock[item] += n
        return _result(self.config.version, item, stock[item]), True

    def _replay(self, task: Task, messages: list[Message]) -> tuple[dict[str, int], int, int]:
        """Inventory after every call in `messages`; also (#valid calls, #calls)."""
        stock = {i: 0 for i in ITEMS}
        stock[task.info["item"]] = task.info["stock"]
        valid = total = 0
        for m in messages:
            if m["role"] == "assistant":
                for c in parse_tool_calls(m["content"]).calls:
                    total += 1
                    valid += self._call(stock, c)[1]
        return stock, valid, total

    def step(self, task: Task, messages: list[Message], assistant_text: str) -> StepResult:
        parsed = parse_tool_calls(assistant_text)
        if not parsed.calls and not parsed.errors:
            return StepResult((), done=True)   # a plain reply is the final answer
        stock, _, _ = self._replay(task, messages[:-1])
        payloads = [{"error": e} for e in parsed.errors]
        payloads += [self._call(stock, c)[0] for c in parsed.calls]
        obs = tuple({"role": "tool", "content": tool_response(p)} for p in payloads)
        return StepResult(obs, done=False)

    def verify(self, task: Task, messages: list[Message]) -> Score:
        stock, valid, total = self._replay(task, messages)
        final = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        parsed = parse_tool_calls(final)
        v = float(self.config.version)
        comps = {"tool_calls_valid": valid / total if total else 0.0, "version": v}
        if parsed.calls or parsed.errors:
            return Score(0.0, {**comps, "correct": 0.0}, "episode ended inside a tool call")
        if valid == 0:
            # the stock can only be known from a tool result: a right number without one is a guess
            return Score(0.0, {**comps, "correct": 0.0}, "no valid tool call: the answer is a guess")
        got = parse_answer(parsed.text)
        added = stock[task.info["item"]] - task.info["stock"]
        correct = float(got == task.answer and added == task.info["add"])
        reason = "correct" if correct else (
            f"stock changed by {added}, asked {task.info['add']}" if added != task.info["add"]
            else f"expected {task.answer}, got {got}")
        return Score(correct, {**comps, "correct": correct}, reason)

    # --- validation -------------------------------------------------------------------
    def gold_turns(self, task: Task) -> list[str]:
        names = {s.kind: s for s in self.api.values()}
        item, add = task.info["item"], task.info["add"]
        turns = []
        if add:
            a = names["add"]
            turns.append(format_call(a.name, {a.args[0]: item, a.args[1]: add}))
        else:
            g = names["get"]
            turns.append(format_call(g.name, {g.args[0]: item}))
        return turns + [str(task.answer)]

    def wrong_turns(self, task: Task) -> list[str]:
        return self.gold_turns(task)[:-1] + [str(task.answer + 1)]


def make_tools(**options) -> ToolsEnv:
    return ToolsEnv(ToolsConfig(**options))

