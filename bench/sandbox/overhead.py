"""Sandbox throughput: `python3 -c pass` bare vs sandboxed, sequential and 2 at a time.

    python -m bench.sandbox.overhead [--runs 200]

Goals (issue #3): overhead <= 10 ms per run; pool throughput >= 60% of bare subprocess
throughput at the same parallelism.
"""
from __future__ import annotations

BENCH = {"results": "sandbox/overhead", "minutes": 2,
         "measures": ("`python3 -c pass` bare vs sandboxed, sequential and 2 at a time; overhead per run")}   # found by bench/run_all.py

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench import common

from gymloop.sandbox import Pool

PROGRAM = ["/usr/bin/python3", "-c", "pass"]


def bare() -> None:
    subprocess.run(PROGRAM, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={})


def throughput(fn, runs: int, parallel: int) -> float:
    t0 = time.perf_counter()
    if parallel == 1:
        for _ in range(runs):
            fn()
    else:
        with ThreadPoolExecutor(parallel) as ex:
            list(ex.map(lambda _: fn(), range(runs)))
    return runs / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with Pool(slots=2) as pool:
        def boxed():
            r = pool.run(PROGRAM)
            assert r.ok, r

        def med(fn, par):
            return statistics.median(throughput(fn, args.runs, par) for _ in range(args.repeats))

        boxed()
        seq_bare, seq_box = med(bare, 1), med(boxed, 1)
        par_bare, par_box = med(bare, 2), med(boxed, 2)
        leftovers = pool.leftover_processes()
    overhead_ms = 1000 / seq_box - 1000 / seq_bare
    rows = [["mode", "bare runs/s", "sandboxed runs/s", "sandboxed / bare", "ms per run (sandboxed)"],
            ["sequential", f"{seq_bare:.1f}", f"{seq_box:.1f}", f"{seq_box / seq_bare:.0%}", f"{1000 / seq_box:.1f}"],
            ["2 at a time", f"{par_bare:.1f}", f"{par_box:.1f}", f"{par_box / par_bare:.0%}", f"{2000 / par_box:.1f}"]]
    print(f"Sandbox throughput, `python3 -c pass`, {args.runs} runs x {args.repeats} (median), bubblewrap")
    print(common.table(rows))
    print(f"overhead per run: {overhead_ms:.1f} ms (goal <= 10); pool at 2 slots: "
          f"{par_box / par_bare:.0%} of bare (goal >= 60%); leftover processes: {len(leftovers)}")
    common.save("sandbox/overhead", {"sequential_bare": seq_bare, "sequential_sandboxed": seq_box,
                            "parallel_bare": par_bare, "parallel_sandboxed": par_box,
                            "overhead_ms": overhead_ms})


if __name__ == "__main__":
    sys.exit(main())
