"""Many concurrent multi-turn episodes in one process: 1,000 tools@v1 episodes with the
nano-tools model, every live episode's next turn batched through the engine.

    python -m bench.engines.episodes [--episodes 1000]
"""
from __future__ import annotations

BENCH = {"results": "engines/episodes", "minutes": 3,
         "measures": ("1,000 concurrent tools episodes in one process: episodes/s, peak memory")}   # found by bench/run_all.py

import argparse
import resource
import sys
import time

from bench import common
import torch

from gymloop.models.checkpoint import load_model
from gymloop.bases.registry import resolve_model
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.envs import make_env
from gymloop.rollout.episodes import collect


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=1000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model(resolve_model("nano-tools"))
    env = make_env("tools", version=1)
    per_task = 8
    tasks = env.sample_tasks(args.episodes // per_task, "train", 0)
    engine = NativeEngine(model, tok.pad_token_id, decode=tok.decode, max_batch=256)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    rolls, st = collect(engine, tok, env, tasks, per_task, SamplingParams(max_new_tokens=40, temperature=0.7, seed=0),
                        max_turns=3)
    sec = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    errors = sum(not r.ok for r in rolls)
    rows = [["episodes", "turns", "errors", "success", "seconds", "episodes/s", "generated tok/s", "peak RSS"],
            [len(rolls), sum(r.turns for r in rolls), errors, f"{sum(r.reward for r in rolls) / len(rolls):.1%}",
             f"{sec:.1f}", f"{len(rolls) / sec:.1f}", f"{st.generated_tokens / sec:,.0f}",
             f"{peak / 1024:.0f} MiB (+{(peak - rss0) / 1024:.0f})"]]
    print("Concurrent tools@v1 episodes, nano-tools, <= 3 turns, batched across episodes")
    print(common.table(rows))
    common.save("engines/episodes", {"episodes": len(rolls), "errors": errors, "seconds": sec, "peak_rss_kib": peak})


if __name__ == "__main__":
    sys.exit(main())
