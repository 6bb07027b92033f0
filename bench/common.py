"""Helpers shared by the benchmark scripts: steady CPU settings, medians, tables."""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

RESULTS = Path(__file__).parent / "results"


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    fmt = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(rows[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows[1:]])


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def matmul_gflops(n: int = 512, seconds: float = 1.0) -> float:
    """The machine's practical float32 ceiling: median GFLOP/s of an n x n matmul."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    reps = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        reps.append(10 * 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return statistics.median(reps)
