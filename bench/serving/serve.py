"""Serving throughput: `gymloop serve` (nano) sequential vs 32 concurrent clients.

    python -m bench.serving.serve [--requests 25]

The server runs as its own process, as in production; clients use HTTP keep-alive.
Goal (issue #5): dynamic batching gives >= 5x the sequential throughput.
"""
from __future__ import annotations

BENCH = {"results": "serving/serve", "minutes": 2,
         "measures": ("`gymloop serve` requests/s and p50/p99 latency, sequential vs 32 concurrent clients")}   # found by bench/run_all.py

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bench import common
import httpx

KEY = "bench-key"


def start(db: str) -> tuple[subprocess.Popen, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([sys.executable, "-m", "gymloop.cli", "serve", "--db", db, "--port", str(port),
                             "--api-key", KEY], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ})
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(base + "/healthz", timeout=0.5)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def load(base: str, clients: int, per_client: int) -> tuple[float, list[float]]:
    body = {"model": "gymloop-nano", "messages": [{"role": "user", "content": "23+45="}], "max_tokens": 8}

    def worker(_):
        lat = []
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as c:
            for _ in range(per_client):
                t0 = time.perf_counter()
                r = c.post(base + "/v1/chat/completions", json=body)
                r.raise_for_status()
                lat.append(time.perf_counter() - t0)
        return lat

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        lats = [x for part in ex.map(worker, range(clients)) for x in part]
    return len(lats) / (time.perf_counter() - t0), lats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=25, help="requests per client")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        proc, base = start(os.path.join(d, "bench.db"))
        try:
            load(base, 4, 5)                                   # warm up
            seq_rps, seq_lat = load(base, 1, 100)
            con_rps, con_lat = load(base, 32, args.requests)
        finally:
            proc.kill()
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] * 1000  # noqa: E731
    rows = [["mode", "requests", "req/s", "p50 ms", "p99 ms"],
            ["sequential", len(seq_lat), f"{seq_rps:.1f}", f"{q(seq_lat, 50):.1f}", f"{q(seq_lat, 99):.1f}"],
            ["32 concurrent", len(con_lat), f"{con_rps:.1f}", f"{q(con_lat, 50):.1f}", f"{q(con_lat, 99):.1f}"]]
    print("gymloop serve (nano, 8 new tokens, traces committed per request), HTTP keep-alive clients")
    print(common.table(rows))
    print(f"dynamic batching: {con_rps / seq_rps:.1f}x the sequential throughput (goal >= 5x)")
    common.save("serving/serve", {"sequential_rps": seq_rps, "concurrent_rps": con_rps,
                          "p50_seq_ms": q(seq_lat, 50), "p99_seq_ms": q(seq_lat, 99),
                          "p50_con_ms": q(con_lat, 50), "p99_con_ms": q(con_lat, 99)})


if __name__ == "__main__":
    sys.exit(main())
