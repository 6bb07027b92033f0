"""A group of n samples in one request (`n` with logprobs, as RL drivers over HTTP ask for it)
against the same n samples as n separate requests, through the official `openai` client on a
real `gymloop serve` of nano (in this process, on loopback).

    python -m bench.engines.n_group [--n 8] [--repeats 7] [--max-tokens 16]

Rows: one request with n=8; 8 requests one after another; 8 requests at once (8 client threads:
the batcher may group them too, if they arrive within its wait). Median seconds over repeats,
the three timed in turns whose order rotates.
"""
from __future__ import annotations

BENCH = {"results": "engines/n_group", "minutes": 5,
         "measures": ("a request's n samples as one group of the engine's batch vs n separate requests")}   # found by bench/run_all.py

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import common
from openai import OpenAI

from gymloop.bases.registry import resolve_model
from gymloop.serve import build, shutdown
from gymloop.serve.background import ServerThread
from gymloop.serve.config import ServeConfig

KEY = "sk-bench"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    cfg = ServeConfig(model=str(resolve_model("nano", progress=False)), model_name="nano",
                      db=str(Path(tempfile.mkdtemp()) / "s.db"), api_keys=[KEY], fine_tuning=False)
    app, _, _ = build(cfg)
    ask = dict(model="nano", messages=[{"role": "user", "content": "12+34="}], max_tokens=args.max_tokens,
               temperature=1.0, logprobs=True)
    with ServerThread(app) as base:
        client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        pool = ThreadPoolExecutor(args.n)
        ways = {
            f"one request, n={args.n}": lambda: client.chat.completions.create(**ask, n=args.n).choices,
            f"{args.n} requests, one after another": lambda: [client.chat.completions.create(**ask).choices[0]
                                                             for _ in range(args.n)],
            f"{args.n} requests at once": lambda: list(pool.map(
                lambda _: client.chat.completions.create(**ask).choices[0], range(args.n))),
        }
        for fn in ways.values():                # warm-up, and each gives n choices with log-probs
            choices = fn()
            assert len(choices) == args.n and all(c.logprobs.content for c in choices)
        seconds: dict[str, list[float]] = {k: [] for k in ways}
        names = list(ways)
        for i in range(args.repeats):
            for k in names[i % len(names):] + names[:i % len(names)]:      # rotate the order
                t0 = time.perf_counter()
                ways[k]()
                seconds[k].append(time.perf_counter() - t0)
        pool.shutdown()
    shutdown(app)
    group = statistics.median(seconds[names[0]])
    rows = [["way", "median s", f"vs one request with n={args.n}"]]
    rows += [[k, f"{statistics.median(v):.3f}", f"{statistics.median(v) / group:.2f}x"] for k, v in seconds.items()]
    print(common.table(rows, title=f"{args.n} samples of one prompt with logprobs, {args.max_tokens} tokens at most, "
                       f"nano, openai client, median of {args.repeats}, rotating order"))
    common.save("engines/n_group", {"args": vars(args), "seconds": seconds})


if __name__ == "__main__":
    main()
