"""Helpers shared by the benchmark scripts: steady CPU settings, medians, tables, results files.

Every table a script prints through `table()` is also recorded, and `save()` writes it with the
raw data, the commit and the machine to `bench/results/<group>/<bench>/<date>-<cpu>.json`
(committed); `python -m bench.render` renders bench/README.md's tables from those files, so no figure there is typed in.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

RESULTS = Path(__file__).parent / "results"
# every table printed by this process, in order: what save() writes beside the raw data
_TABLES: list[dict] = []


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def alternating_medians(a: Callable[[], object], b: Callable[[], object], repeats: int = 5,
                        warmup: int = 1) -> tuple[float, float]:
    """Median seconds of `a` and of `b`, timed in turns whose order alternates (a b, b a, ...), so
    neither side always runs first, after a warm machine or next to the other's leftovers."""
    for _ in range(warmup):
        a()
        b()
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(repeats):
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            fn = a if k == 0 else b
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def format_table(rows: list[list[str]]) -> str:
    """Rows of cells (the first the header) as aligned text columns."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    fmt = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(rows[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows[1:]])


def table(rows: list[list[str]], title: str | None = None, record: bool = True) -> str:
    """`format_table(rows)`, recorded (unless `record` is False: a partial table printed as a run
    goes) so that save() writes it with the results."""
    if record:
        _TABLES.append({"title": title, "rows": [[str(c) for c in r] for r in rows]})
    return format_table(rows)


def cpu() -> dict:
    """The CPU as /proc/cpuinfo names it (vendor, model name, family/model: a VM often hides the
    model name, the family tells the generation), and the cores this process may use."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return {"model_name": info.get("model name", platform.processor() or platform.machine()),
            "vendor": info.get("vendor_id", ""), "family": info.get("cpu family", ""), "model": info.get("model", ""),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def cpu_slug(c: dict) -> str:
    """A file-name form of the CPU: 'amd-epyc-f25m1'."""
    name = re.sub(r"\(r\)|\(tm\)|cpu|@.*|processor", "", c["model_name"].lower())
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cpu"
    return f"{name}-f{c['family']}m{c['model']}" if c["family"] else name


def commit() -> dict:
    """The checkout the bench ran from: HEAD and whether tracked files differed from it."""
    root = Path(__file__).parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
        return {"commit": head, "dirty": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


# where the run started: a commit made while a long bench runs is not what it ran
STARTED_FROM = commit()


def meta() -> dict:
    import torch

    now = datetime.datetime.now(datetime.timezone.utc)
    return {"date": now.date().isoformat(), "time": now.isoformat(timespec="seconds"), **STARTED_FROM, "cpu": cpu(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "argv": sys.argv[1:],
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}


def save(name: str, data: dict) -> Path:
    """Write `data` with the tables printed so far and the run's meta() to
    bench/results/<name>/<date>-<cpu>.json (a second run the same day gets -2, -3, ...: every
    run is kept)."""
    m = meta()
    folder = RESULTS / name
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{m['date']}-{cpu_slug(m['cpu'])}"
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    path.write_text(json.dumps({"bench": name, "meta": m, "tables": _TABLES, **data}, indent=1) + "\n")
    print(f"results: {path.relative_to(RESULTS.parent.parent)}")
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


def run_job(client, model: str, rows: list[dict], method: dict, suffix: str, poll_s: float = 1.0):
    """Upload `rows` as a training file, run a fine-tuning job of `model` on it through the
    `openai` client and wait for it: (the finished job, its wall seconds). Exits on a failed job."""
    import io

    data = "\n".join(json.dumps(r) for r in rows).encode()
    f = client.files.create(file=(f"{suffix}.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert f.status == "processed", f.status_details
    job = client.fine_tuning.jobs.create(model=model, training_file=f.id, suffix=suffix, seed=0, method=method)
    t0 = time.perf_counter()
    while job.status not in ("succeeded", "failed", "cancelled"):
        time.sleep(poll_s)
        job = client.fine_tuning.jobs.retrieve(job.id)
    if job.status != "succeeded":
        raise SystemExit(f"job {job.id} {job.status}: {job.error}")
    return job, time.perf_counter() - t0
