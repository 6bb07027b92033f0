"""`calls`: function calling from the schemas in the request, one call per task.

A task is a user request and a few tools (OpenAI function schemas, in the request's `tools`, as
agent frameworks send them): the model must call the right one with the right arguments. The
catalogue's tools are split by name: the training split's tasks use only training tools and the
held-out split's only held-out tools, so a held-out score measures reading schemas a model was
never shown, not recalling names it was trained on. Requests are phrased from per-tool templates.

Version 2 is the catalogue after an API redesign: every tool and argument renamed (`get_weather(city)`
became `weather_now(location)`; the table V2 below), in the schemas too, so a model that reads them
can adapt and one that memorised version 1's names cannot. Nothing of version 2 is in any base's
training data. `heldout: requests` keeps every split on the training tools (a task's split is a
hash of the whole request): the held-out score then measures the production agent's own tools on
requests it never saw, which is what a loop's gate needs after such a drift. `heldout:
new-tool-requests` puts every split on the held-out tools, split the same way: a model taught the
training tools by demonstrations is then taught the others by a grader alone (a reinforcement
job's prompts are the training split: no demonstration of those tools anywhere) and measured on
their requests it never saw.

Verified on the reply's calls (gymloop's one tool format, models/toolcalls.py): reward 1 when it
is exactly one well-formed call of the expected tool with the expected arguments (strings
compared case-insensitively, numbers by value). Components: `valid` (the call names an offered
tool with its required arguments, right or not), `tool` (one call, of the expected tool),
`arguments` (and with the expected argument names), `correct` (the reward): partial credit
for training (grpo.reward_weights) on what a renamed API breaks first.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..models.toolcalls import format_call, parse_tool_calls
from .base import Environment, Message, Score, Split, Task, split_of

CITIES = ("Paris", "Lagos", "Osaka", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Austin", "Porto", "Dublin", "Hanoi")
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Juno")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
WORDS = ("apple", "river", "lamp", "garden", "engine", "ticket", "pillow", "violin", "candle", "mirror")
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "INR", "BRL")
LANGUAGES = ("French", "Spanish", "German", "Japanese", "Italian", "Swahili")
TICKERS = ("AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "SHOP")
COLORS = ("red", "blue", "green", "black", "white", "yellow")


@dataclass(frozen=True)
class Tool:
    """A tool of the catalogue: its schema and how to phrase a request for it."""

    name: str
    description: str
    params: dict[str, str]                         # argument -> JSON type ("string" | "integer")
    templates: tuple[str, ...]                     # requests; {arg} is replaced by its value
    draw: Callable[[random.Random], dict]          # arguments of one request

    def renamed(self, name: str, args: dict[str, str]) -> "Tool":
        """This tool under another name and argument names (what a request asks is unchanged)."""
        templates = self.templates
        for old, new in args.items():
            templates = tuple(t.replace("{" + old + "}", "{" + new + "}") for t in templates)
        draw = self.draw
        return Tool(name, self.description, {args[a]: t for a, t in self.params.items()}, templates,
                    lambda rng: {args[k]: v for k, v in draw(rng).items()})

    def schema(self) -> dict:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": {a: {"type": t} for a, t in self.params.items()},
                           "required": list(self.params)}}}


def _pick(**choices: tuple) -> Callable[[random.Random], dict]:
    def draw(rng: random.Random) -> dict:
        return {k: (rng.randint(*v[1:]) if v and v[0] == "int" else rng.choice(v)) for k, v in choices.items()}
    return draw


def _two(key_a: str, key_b: str, pool: tuple, **rest: tuple) -> Callable[[random.Random], dict]:
    """Two different values of one pool (origin and destination), and the rest."""
    def draw(rng: random.Random) -> dict:
        a, b = rng.sample(pool, 2)
        return {key_a: a, key_b: b, **_pick(**rest)(rng)}
    return draw


CATALOGUE: tuple[Tool, ...] = (
    Tool("get_weather", "Current weather of a city.", {"city": "string"},
         ("What's the weather in {city}?", "Is it raining in {city} right now?"), _pick(city=CITIES)),
    Tool("convert_currency", "Convert an amount between currencies.",
         {"amount": "integer", "from_currency": "string", "to_currency": "string"},
         ("Convert {amount} {from_currency} to {to_currency}.", "How much is {amount} {from_currency} in {to_currency}?"),
         _two("from_currency", "to_currency", CURRENCIES, amount=("int", 2, 900))),
    Tool("send_email", "Send a short email.", {"to": "string", "subject": "string"},
         ("Email {to} with the subject {subject}.", "Send {to} an email titled {subject}."),
         _pick(to=NAMES, subject=WORDS)),
    Tool("set_alarm", "Set an alarm at an hour of the day (0-23).", {"hour": "integer"},
         ("Wake me up at {hour} o'clock.", "Set an alarm for hour {hour}."), _pick(hour=("int", 0, 23))),
    Tool("search_flights", "Find flights between two cities.", {"origin": "string", "destination": "string"},
         ("Find flights from {origin} to {destination}.", "Any flights {origin} to {destination}?"),
         _two("origin", "destination", CITIES)),
    Tool("book_table", "Book a restaurant table.", {"people": "integer", "day": "string"},
         ("Book a table for {people} on {day}.", "Reserve dinner for {people} people on {day}."),
         _pick(people=("int", 1, 12), day=DAYS)),
    Tool("get_stock_price", "Latest price of a stock ticker.", {"ticker": "string"},
         ("What is {ticker} trading at?", "Price of {ticker} please."), _pick(ticker=TICKERS)),
    Tool("translate", "Translate a word into a language.", {"word": "string", "language": "string"},
         ("Translate {word} into {language}.", "How do you say {word} in {language}?"),
         _pick(word=WORDS, language=LANGUAGES)),
    Tool("get_distance", "Distance in km between two cities.", {"origin": "string", "destination": "string"},
         ("How far is {origin} from {destination}?", "Distance between {origin} and {destination}?"),
         _two("origin", "destination", CITIES)),
    Tool("set_thermostat", "Set a room's temperature in Celsius.", {"room": "string", "celsius": "integer"},
         ("Set the {room} to {celsius} degrees.", "Make the {room} {celsius} degrees."),
         _pick(room=("kitchen", "bedroom", "office", "hall"), celsius=("int", 15, 28))),
    Tool("find_recipe", "Recipes that use an ingredient.", {"ingredient": "string"},
         ("Find me a recipe with {ingredient}.", "What can I cook with {ingredient}?"),
         _pick(ingredient=("rice", "lentils", "tofu", "eggs", "okra", "leeks"))),
    Tool("track_package", "Where a parcel is, by its tracking number.", {"tracking_number": "integer"},
         ("Where is parcel {tracking_number}?", "Track package {tracking_number}."),
         _pick(tracking_number=("int", 1000, 99999))),
    Tool("reserve_hotel", "Reserve a hotel in a city for some nights.", {"city": "string", "nights": "integer"},
         ("Book a hotel in {city} for {nights} nights.", "I need {nights} nights in {city}."),
         _pick(city=CITIES, nights=("int", 1, 14))),
    Tool("get_news", "Headlines on a topic.", {"topic": "string"},
         ("Any news about {topic}?", "Show headlines on {topic}."),
         _pick(topic=("science", "football", "markets", "music", "weather", "chess"))),
    Tool("add_todo", "Add an item to the to-do list.", {"item": "string"},
         ("Add {item} to my to-do list.", "Remind me to buy {item}."), _pick(item=WORDS)),
    Tool("rent_car", "Rent a car in a city for some days.", {"city": "string", "days": "integer"},
         ("Rent a car in {city} for {days} days.", "I want a car for {days} days in {city}."),
         _pick(city=CITIES, days=("int", 1, 21))),
    Tool("get_time", "Current time in a city.", {"city": "string"},
         ("What time is it in {city}?", "Tell me the local time in {city}."), _pick(city=CITIES)),
    Tool("define_word", "Dictionary definition of a word.", {"word": "string"},
         ("Define {word}.", "What does {word} mean?"), _pick(word=WORDS)),
    Tool("schedule_meeting", "Schedule a meeting with a person on a day.", {"person": "string", "day": "string"},
         ("Set up a meeting with {person} on {day}.", "Meet {person} {day}, please schedule it."),
         _pick(person=NAMES, day=DAYS)),
    Tool("paint_wall", "Paint a wall a colour.", {"color": "string", "wall": "integer"},
         ("Paint wall {wall} {color}.", "Make wall number {wall} {color}."),
         _pick(color=COLORS, wall=("int", 1, 9))),
    Tool("order_taxi", "Order a taxi to a street address number.", {"street_number": "integer", "passengers": "integer"},
         ("Taxi to number {street_number} for {passengers}.", "Get a cab for {passengers} people to {street_number}."),
         _pick(street_number=("int", 1, 400), passengers=("int", 1, 6))),
    Tool("water_plants", "Water the plants of a room.", {"room": "string"},
         ("Water the plants in the {room}.", "The {room} plants need water."),
         _pick(room=("kitchen", "bedroom", "office", "hall"))),
    Tool("call_contact", "Phone a contact.", {"name": "string"},
         ("Call {name}.", "Ring {name} for me."), _pick(name=NAMES)),
    Tool("play_playlist", "Play a playlist by its number.", {"playlist": "integer"},
         ("Play playlist {playlist}.", "Put on playlist number {playlist}."), _pick(playlist=("int", 1, 50))),
)
# Version 2: catalogue name -> (new name, {old argument: new argument}).
V2: dict[str, tuple[str, dict[str, str]]] = {
    "get_weather": ("weather_now", {"city": "location"}),
    "convert_currency": ("fx_quote", {"amount": "value", "from_currency": "source", "to_currency": "target"}),
    "send_email": ("mail_compose", {"to": "recipient", "subject": "title"}),
    "set_alarm": ("alarm_create", {"hour": "at_hour"}),
    "search_flights": ("air_search", {"origin": "start", "destination": "end"}),
    "book_table": ("restaurant_reserve", {"people": "guests", "day": "weekday"}),
    "get_stock_price": ("quote_equity", {"ticker": "symbol"}),
    "translate": ("lang_render", {"word": "text", "language": "target_language"}),
    "get_distance": ("route_length", {"origin": "start", "destination": "end"}),
    "set_thermostat": ("climate_set", {"room": "zone", "celsius": "degrees"}),
    "find_recipe": ("recipes_search", {"ingredient": "main_ingredient"}),
    "track_package": ("parcel_status", {"tracking_number": "parcel_id"}),
    "reserve_hotel": ("lodging_book", {"city": "location", "nights": "stay_nights"}),
    "get_news": ("headlines_fetch", {"topic": "subject"}),
    "add_todo": ("tasks_append", {"item": "entry"}),
    "rent_car": ("vehicle_hire", {"city": "location", "days": "rental_days"}),
    "get_time": ("clock_local", {"city": "location"}),
    "define_word": ("lexicon_lookup", {"word": "term"}),
    "schedule_meeting": ("calendar_invite", {"person": "attendee", "day": "weekday"}),
    "paint_wall": ("wall_paint", {"color": "shade", "wall": "wall_id"}),
    "order_taxi": ("ride_request", {"street_number": "address_number", "passengers": "riders"}),
    "water_plants": ("irrigation_start", {"room": "zone"}),
    "call_contact": ("phone_dial", {"name": "contact"}),
    "play_playlist": ("music_queue", {"playlist": "playlist_id"}),
}


def catalogue(version: int) -> tuple[Tool, ...]:
    """The catalogue's tools as a version names them."""
    return CATALOGUE if version == 1 else tuple(t.renamed(*V2[t.name]) for t in CATALOGUE)


SYSTEM = "You are an assistant that acts by calling one of the tools you are given."


class CallsConfig(BaseModel):
    """The calls environment."""

    model_config = ConfigDict(extra="forbid")

    tools_per_task: int = Field(3, ge=1, le=6, description="Tools offered per request (the right one and "
                                "others of the same split).")
    heldout_fraction: float = Field(0.33, gt=0, lt=1, description="Share of the catalogue's tools kept for "
                                    "held-out tasks (chosen by a hash of the tool's name).")
    system: str | None = Field(SYSTEM, description="The system message (None: none).")
    version: Literal[1, 2] = Field(1, description="Tool API version (2: every tool and argument renamed, in the "
                                   "schemas too; `calls@v2` is shorthand).")
    heldout: Literal["tools", "requests", "new-tool-requests"] = Field(
        "tools", description="What held-out tasks hold out: tools (they use only tools training never shows), "
        "requests (every split uses the training tools; a task's split is a hash of its request) or "
        "new-tool-requests (every split uses the held-out tools, split by request).")


def _matches(got: object, want: object) -> bool:
    if isinstance(want, str):
        return isinstance(got, str) and got.strip().lower() == want.lower()
    return isinstance(got, (int, float)) and not isinstance(got, bool) and got == want


class CallsEnv(Environment):
    def __init__(self, config: CallsConfig | None = None) -> None:
        self.config = config or CallsConfig()
        tools = catalogue(self.config.version)
        self.split_tools: dict[str, list[Tool]] = {"train": [], "heldout": []}
        for first, tool in zip(CATALOGUE, tools):     # split by the first name: the same tools in every version
            self.split_tools[split_of(f"calls:{first.name}", self.config.heldout_fraction)].append(tool)
        if self.config.heldout == "requests":
            self.split_tools["heldout"] = self.split_tools["train"]
        elif self.config.heldout == "new-tool-requests":
            self.split_tools["train"] = self.split_tools["heldout"]
        for split, pool in self.split_tools.items():
            if len(pool) < self.config.tools_per_task:
                raise ValueError(f"only {len(pool)} {split} tools for tools_per_task={self.config.tools_per_task}")
        self._by_name = {t.name: t for t in tools}

    @property
    def name(self) -> str:  # type: ignore[override]
        return "calls" if self.config.version == 1 else f"calls@v{self.config.version}"

    def _task(self, split: Split, tool: Tool, args: dict, template: int, offered: list[str]) -> Task:
        question = tool.templates[template].format(**args)
        prompt = (({"role": "system", "content": self.config.system},) if self.config.system else ()) + (
            {"role": "user", "content": question},)
        return Task(id=f"calls:{split}:{tool.name}:{template}:{json_args(args)}:{','.join(offered)}", env=self.name,
                    prompt=prompt, answer={"name": tool.name, "arguments": args}, split=split,
                    info={"tools": offered})

    def draw(self, rng: random.Random, split: Split) -> Task:
        pool = self.split_tools[split]
        while True:
            tool = rng.choice(pool)
            others = rng.sample([t for t in pool if t is not tool], self.config.tools_per_task - 1)
            offered = [t.name for t in others]
            offered.insert(rng.randint(0, len(offered)), tool.name)
            task = self._task(split, tool, tool.draw(rng), rng.randrange(len(tool.templates)), offered)
            if self.config.heldout == "tools" or self._request_split(task) == split:
                return task

    def _request_split(self, task: Task) -> Split:
        """heldout=requests (or new-tool-requests): the split of a request, by its text (not the
        tools' names, so a request is held out in every version)."""
        return split_of(f"calls:{task.prompt[-1]['content']}", self.config.heldout_fraction)

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        rng = random.Random(f"calls|{split}|{seed}")
        tasks: dict[str, Task] = {}
        for _ in range(50 * n):
            t = self.draw(rng, split)
            tasks.setdefault(t.id, t)
            if len(tasks) == n:
                return list(tasks.values())
        raise ValueError(f"could not draw {n} distinct {split} tasks")

    def task_from_id(self, task_id: str) -> Task:
        try:
            _, split, name, template, args, offered = task_id.split(":", 5)
            tool = self._by_name[name]
            return self._task(split, tool, _args_of(tool, args), int(template), offered.split(","))
        except (ValueError, KeyError):
            raise ValueError(f"not a calls task id: {task_id!r}") from None

    def tools(self, task: Task) -> list[dict]:
        return [self._by_name[n].schema() for n in task.info["tools"]]

    def verify(self, task: Task, messages: list[Message]) -> Score:
        reply = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        parsed = parse_tool_calls(reply)
        want = task.answer
        if parsed.errors or len(parsed.calls) != 1:
            why = parsed.errors[0] if parsed.errors else f"{len(parsed.calls)} calls, expected 1"
            return Score(0.0, dict.fromkeys(("valid", "tool", "arguments", "correct"), 0.0), why)
        call = parsed.calls[0]
        tool = self._by_name.get(call.name)
        valid = float(call.name in task.info["tools"] and tool is not None and set(call.arguments) == set(tool.params))
        right_tool = call.name == want["name"]
        names = right_tool and set(call.arguments) == set(want["arguments"])
        correct = float(names and all(_matches(call.arguments[k], v) for k, v in want["arguments"].items()))
        reason = "correct" if correct else ("wrong tool" if not right_tool else "wrong arguments")
        return Score(correct, {"valid": valid, "tool": float(right_tool), "arguments": float(names),
                               "correct": correct}, reason)

    def demonstration(self, task: Task) -> dict:
        """A supervised fine-tuning row in OpenAI's function-calling format: the request, then the
        expected call as an assistant message with `tool_calls`, and the offered tools."""
        call = {"id": "call_0", "type": "function", "function": {
            "name": task.answer["name"], "arguments": json.dumps(task.answer["arguments"])}}
        return {"messages": list(task.prompt) + [{"role": "assistant", "content": None, "tool_calls": [call]}],
                "tools": self.tools(task)}

    def gold_reply(self, task: Task) -> str:
        return format_call(task.answer["name"], task.answer["arguments"])

    def gold_turns(self, task: Task) -> list[str]:
        return [self.gold_reply(task)]

    def wrong_turns(self, task: Task) -> list[str]:
        args = dict(task.answer["arguments"])
        key = next(iter(args))
        args[key] = args[key] + 1 if isinstance(args[key], int) else args[key] + "x"
        return [format_call(task.answer["name"], args)]


def json_args(args: dict) -> str:
    """Arguments in a task id: k=v pairs joined by '&' (values hold no ':' ',' '&' '=')."""
    return "&".join(f"{k}={v}" for k, v in args.items())


def _args_of(tool: Tool, text: str) -> dict:
    pairs = dict(p.split("=", 1) for p in text.split("&"))
    if set(pairs) != set(tool.params):
        raise ValueError(f"arguments {sorted(pairs)} are not {tool.name}'s")
    # in the id's order, which is the order they were drawn in (the id round-trips)
    return {k: int(v) if tool.params[k] == "integer" else v for k, v in pairs.items()}


def make_calls(**options) -> CallsEnv:
    return CallsEnv(CallsConfig(**options))
