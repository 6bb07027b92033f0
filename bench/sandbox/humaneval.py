"""Verification throughput of code environments: HumanEval canonical solutions through the
sandbox pool, 1 slot vs 2 slots.

    python -m bench.sandbox.humaneval
"""
from __future__ import annotations

BENCH = {"results": "sandbox/humaneval", "minutes": 2,
         "measures": ("HumanEval canonical solutions verified per second through the sandbox pool")}   # found by bench/run_all.py

import sys
import time

from bench import common

from gymloop.envs.humaneval import HumanEvalConfig, HumanEvalEnv


def main() -> None:
    rows = [["slots", "problems", "passed", "seconds", "problems/s"]]
    out = {}
    for slots in (1, 2):
        env = HumanEvalEnv(HumanEvalConfig(slots=slots))
        tasks = env.sample_tasks(164, "heldout", 0)
        items = [(t, [*t.prompt, {"role": "assistant", "content": env.gold_reply(t)}]) for t in tasks]
        env.verify_batch(items[:4])                       # warm the pool
        t0 = time.perf_counter()
        scores = env.verify_batch(items)
        sec = time.perf_counter() - t0
        env.close()
        passed = sum(s.reward == 1.0 for s in scores)
        rows.append([slots, len(tasks), passed, f"{sec:.2f}", f"{len(tasks) / sec:.1f}"])
        out[slots] = {"seconds": sec, "passed": passed}
    print("HumanEval canonical solutions verified in the bubblewrap sandbox")
    print(common.table(rows))
    common.save("sandbox/humaneval", out)


if __name__ == "__main__":
    sys.exit(main())
