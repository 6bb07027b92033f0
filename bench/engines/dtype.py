"""Generation in the model's dtype (float32) vs bfloat16 (`engine_dtype`), SmolLM2-135M-Instruct.

    python -m bench.engines.dtype [--model smollm2] [--repeats 3] [--threads 1]

Two workloads of the agent chapter, each timed in turns (model, bfloat16, bfloat16, model, ...):
- evaluate: greedy held-out evaluation of `calls@v2` requests (three tools' schemas in each prompt,
  ~360 prompt tokens, up to 48 new: prefill is most of it), the gate's and a run's evaluation;
- serve: a server (`gymloop serve --engine-dtype ...`) answering the same requests from 16
  concurrent `openai` clients, as the chapter's production traffic does.
Reports the median seconds of each, the ratio, and the score of each dtype (greedy: a dtype that
changed answers shows here).
"""
from __future__ import annotations

BENCH = {"results": "engines/dtype", "minutes": 10,
         "measures": ("generation in the model's dtype (float32) vs bfloat16 (`engine_dtype`) on SmolLM2: a greedy "
                      "held-out evaluation and a server's answers to 16 concurrent clients, seconds and score of each")}   # found by bench/run_all.py

import argparse
import tempfile
from pathlib import Path

from bench import common  # noqa: F401  (sets OMP_WAIT_POLICY before torch)
import torch

from gymloop.bases.registry import resolve_model
from gymloop.engine import NativeEngine
from gymloop.envs import make_env
from gymloop.demos.traffic import send_traffic
from gymloop.models.checkpoint import load_model
from gymloop.rollout.evaluate import evaluate
from gymloop.serve import ServeConfig
from gymloop.serve.background import serving

DTYPES = ("model", "bfloat16")


def evaluation(model, tok, env, tasks, dtype: str) -> tuple[float, float]:
    """(seconds, pass@1) of a greedy evaluation of `tasks` in `dtype`."""
    res = evaluate(NativeEngine(model, tok.pad_token_id, decode=tok.decode, dtype=dtype), tok, env, tasks,
                   max_new_tokens=48)
    return res.seconds, res.pass1


def served(model_dir: str, env, tasks, dtype: str, concurrency: int) -> tuple[float, float]:
    """(seconds, success rate) of `tasks` sent to a server generating in `dtype` (after a warm-up)."""
    import time

    with tempfile.TemporaryDirectory() as tmp, serving(ServeConfig(
            model=model_dir, model_name="m", db=str(Path(tmp) / "s.db"), api_keys=["k"],
            default_max_tokens=48, engine_dtype=dtype)) as (url, _, store):
        store.versions.add(model_dir, parent=None, status="promoted", scores={})
        send_traffic(url, "k", "m", env, tasks[:4], concurrency=4, max_tokens=48)
        t0 = time.perf_counter()
        out = send_traffic(url, "k", "m", env, tasks, concurrency=concurrency, max_tokens=48)
        return time.perf_counter() - t0, out.success_rate


def main() -> None:
    import logging
    import statistics

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", help="a model name or directory (Llama family)")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    logging.getLogger("gymloop.serve").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    model_dir = str(resolve_model(args.model, progress=True))
    model, tok = load_model(model_dir)
    env = make_env("calls", version=2, heldout="requests")
    tasks = env.sample_tasks(args.requests, "heldout", seed=0)
    work = {"evaluate": lambda dt: evaluation(model, tok, env, tasks, dt),
            "serve": lambda dt: served(model_dir, env, tasks, dt, args.concurrency)}
    rows = [["workload", "model dtype s", "bfloat16 s", "speed-up", "score model", "score bfloat16"]]
    results = {}
    for name, fn in work.items():
        got: dict[str, list] = {dt: [] for dt in DTYPES}
        fn("bfloat16")                                        # warm-up of the bfloat16 kernels
        for i in range(args.repeats):
            for dt in (DTYPES if i % 2 == 0 else DTYPES[::-1]):
                got[dt].append(fn(dt))
        sec = {dt: statistics.median(s for s, _ in got[dt]) for dt in DTYPES}
        score = {dt: got[dt][0][1] for dt in DTYPES}
        results[name] = {dt: {"seconds": [s for s, _ in got[dt]], "score": [x for _, x in got[dt]]} for dt in DTYPES}
        rows.append([name, f"{sec['model']:.1f}", f"{sec['bfloat16']:.1f}", f"{sec['model'] / sec['bfloat16']:.2f}x",
                     f"{score['model']:.1%}", f"{score['bfloat16']:.1%}"])
        print(common.table(rows, record=False), flush=True)
    print(common.table(rows, f"{args.model}, {args.requests} calls@v2 requests, {args.threads} thread(s), "
                             f"median of {args.repeats}"))
    common.save("engines/dtype", {"args": vars(args), "results": results})


if __name__ == "__main__":
    main()
