"""Writes nemo-gym-weather.jsonl: rows for NeMo Gym's example_tool_call_multireward server, its
own example's system prompt and get_weather tool (read from the wheel's example.jsonl) with 12
phrasings x 40 cities, each expecting one get_weather call with the city.

    .venv-nemo-gym/bin/python configs/data/weather_rows.py
"""
import json
from pathlib import Path

import resources_servers.example_tool_call_multireward as example

PHRASINGS = ["what's the weather in {c}?", "how hot is it in {c} today?", "tell me the forecast for {c}",
             "is it raining in {c} right now?", "weather in {c} please", "what is the temperature in {c}?",
             "do I need an umbrella in {c}?", "how cold is it in {c}?", "give me the current weather for {c}",
             "is it sunny in {c}?", "{c} weather", "what are the conditions like in {c} today?"]
CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Lisbon", "Dublin", "Vienna", "Prague", "Warsaw", "Athens",
          "Oslo", "Stockholm", "Helsinki", "Copenhagen", "Amsterdam", "Brussels", "Zurich", "Istanbul", "Cairo",
          "Nairobi", "Lagos", "Mumbai", "Delhi", "Bangkok", "Singapore", "Seoul", "Beijing", "Shanghai", "Sydney",
          "Melbourne", "Auckland", "Toronto", "Montreal", "Chicago", "Boston", "Miami", "Denver", "Mexico City",
          "Lima", "Buenos Aires"]


def main() -> None:
    first = json.loads((Path(list(example.__path__)[0]) / "data" / "example.jsonl").read_text().splitlines()[0])
    system, tools = first["responses_create_params"]["input"][0], first["responses_create_params"]["tools"]
    rows = [{"responses_create_params": {"input": [system, {"content": p.format(c=c), "role": "user"}], "tools": tools},
             "expected_call": {"name": "get_weather", "arguments": {"city": c}}} for c in CITIES for p in PHRASINGS]
    out = Path(__file__).with_name("nemo-gym-weather.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    main()
