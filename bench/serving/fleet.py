"""A serving fleet under load and faults: `gymloop fleet up` with 1 and with 2 replicas (Ray
Serve, the store on an embedded PostgreSQL), locust's users on chat completions + feedback for
`--minutes`; during each run two versions are promoted (at 1/4 and 3/4 of the run) and one
replica is SIGKILLed at 1/2 (Ray Serve starts a new one).

    python -m bench.serving.fleet [--minutes 10] [--users 32] [--replicas 1 2]

Counted, per run: requests/s, chat latency p50/p95/p99 (locust's), failed requests around the
kill and elsewhere, responses whose trace is missing from the store (lost), responses from a
version never promoted, each promotion's roll-out time (promotion -> every replica answering
with it, from the replicas' heartbeats) and the killed replica's replacement time. Raw: the
results file holds the per-second timeline and locust's stats rows.
"""
from __future__ import annotations

BENCH = {"results": "serving/fleet", "minutes": 10,
         "measures": ("`gymloop fleet up` (Ray Serve, an embedded PostgreSQL store) with 1 and 2 replicas under "
                      "locust's users (chat completions + graded feedback) for 10 minutes each, two promotions and one "
                      "replica SIGKILLed per run: requests/s, p50/p95/p99, failed requests around the kill, lost "
                      "traces, answers from unpromoted versions, roll-out and replacement seconds")}   # found by bench/run_all.py

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common

HERE = Path(__file__).parent
KEY = "sk-bench"


def gymloop(*args: str, timeout: float = 600) -> str:
    out = subprocess.run([sys.executable, "-m", "gymloop.cli", *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"gymloop {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return out.stdout


def nudged(src: Path, dst: Path, seed: int) -> Path:
    """A new version of the served model: its weights plus small noise (what a promotion brings,
    without a training run competing with the load for the two cores)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    save_file({k: v + 1e-3 * v.std() * torch.randn(v.shape, generator=g) if v.is_floating_point() and v.numel() > 1
               else v for k, v in w.items()}, str(dst / "model.safetensors"))
    return dst


def wait_for(check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value is not None and value is not False:
            return value
        time.sleep(0.2)
    return None


class CpuMeter(threading.Thread):
    """CPU seconds used during the run by the replicas (pids from the store's heartbeats; a
    killed one counts what it had used by its last sample), by locust, and by the whole machine."""

    def __init__(self, store, locust_pid: int) -> None:
        import psutil

        super().__init__(daemon=True)
        self.store, self.locust_pid, self.psutil = store, locust_pid, psutil
        self.used: dict[int, float] = {}           # pid -> CPU seconds at its last sample
        self.stop_event = threading.Event()
        self.busy0, self.t0 = self._busy(), time.time()

    def _busy(self) -> float:
        c = self.psutil.cpu_times()
        return sum(c) - c.idle - getattr(c, "iowait", 0.0)

    def _sample(self) -> None:
        for pid in {r["pid"] for r in self.store.replicas.list(fleet="gymloop")} | {self.locust_pid}:
            try:
                t = self.psutil.Process(pid).cpu_times()
                self.used[pid] = t.user + t.system
            except self.psutil.Error:
                pass

    def run(self) -> None:
        self._sample()
        self.start_used = dict(self.used)
        while not self.stop_event.wait(1.0):
            self._sample()

    def result(self) -> dict:
        self.stop_event.set()
        self.join(5)
        spent = {pid: v - self.start_used.get(pid, 0.0) for pid, v in self.used.items()}
        return {"wall_s": time.time() - self.t0, "machine_busy_s": self._busy() - self.busy0,
                "locust_s": spent.pop(self.locust_pid, 0.0), "replicas_s": sum(spent.values())}


def run(replicas: int, users: int, minutes: float, model: str, work: Path) -> dict:
    from gymloop.bases.registry import resolve_model
    from gymloop.fleet.audit import audit, replaced, rollout_seconds
    from gymloop.serve.background import free_port
    from gymloop.store import Store

    state, port = work / f"fleet-{replicas}", free_port()
    common_args = ["--state-dir", str(state)]
    t0 = time.time()
    gymloop("fleet", "up", "--replicas", str(replicas), "--workers", "0", "--embedded-db", "--model", model,
            "--api-key", KEY, "--port", str(port), "--jobs-dir", str(work / "jobs"), *common_args)
    up_s = time.time() - t0
    st = json.loads(gymloop("fleet", "status", "--json", *common_args))
    store = Store(st["db"])
    base = resolve_model(model, progress=False)
    versions = [nudged(base, work / f"v{replicas}-{i}", seed=i) for i in (1, 2)]
    log, prefix = work / f"requests-{replicas}.jsonl", work / f"locust-{replicas}"
    seconds = int(minutes * 60)
    env = {**os.environ, "FLEET_BENCH_LOG": str(log), "FLEET_BENCH_KEY": KEY, "FLEET_BENCH_MODEL": _served_name(st["url"])}
    locust = subprocess.Popen([str(Path(sys.executable).with_name("locust")), "-f", str(HERE / "fleet_locustfile.py"),
                               "--headless", "--host", st["url"].removesuffix("/v1"), "-u", str(users), "-r", str(users),
                               "-t", f"{seconds}s", "--csv", str(prefix), "--only-summary", "--stop-timeout", "30"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    start, events = time.time(), {}
    meter = CpuMeter(store, locust.pid)
    meter.start()
    try:
        for at, what in ((0.25, "promote-1"), (0.5, "kill"), (0.75, "promote-2")):
            time.sleep(max(0.0, start + at * seconds - time.time()))
            if what.startswith("promote"):
                path = versions[int(what[-1]) - 1]
                v = json.loads(gymloop("models", "add", str(path), "--promote", "--db", st["db"]))["version"]
                events[what] = {"time": time.time(), "version": v,
                                "rollout_s": wait_for(lambda: rollout_seconds(store, "gymloop", v), 120)}
            else:
                live = store.replicas.list(fleet="gymloop", seen_within_s=3.0)
                pid = live[0]["pid"]
                kill_at = time.time()
                os.kill(pid, signal.SIGKILL)
                back = wait_for(lambda: time.time() if replaced(store, "gymloop", pid, replicas) else None, 300)
                events["kill"] = {"time": kill_at, "pid": pid, "replaced_s": back - kill_at if back else None}
        _, err = locust.communicate(timeout=seconds + 120)
        cpu = meter.result()
    finally:
        if locust.poll() is None:
            locust.kill()
        final = json.loads(gymloop("fleet", "status", "--json", *common_args))
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        chat_ok = [(r["trace"], r["version"]) for r in rows if r["kind"] == "chat" and r["ok"]]
        report = audit(store, chat_ok)
        store.close()
        gymloop("fleet", "down", *common_args)
    return {**summarize(replicas, users, seconds, up_s, rows, report, events, final, prefix), "cpu": cpu}


def _served_name(url: str) -> str:
    import httpx

    return httpx.get(url + "/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()["data"][0]["id"]


def summarize(replicas, users, seconds, up_s, rows, report, events, final, prefix) -> dict:
    chat = [r for r in rows if r["kind"] == "chat"]
    ok = [r for r in rows if r["ok"]]
    kill = events.get("kill", {})
    window = (kill.get("time", 0), kill.get("time", 0) + (kill.get("replaced_s") or 0) + 5)
    failed = [r for r in rows if not r["ok"]]
    around = [r for r in failed if window[0] <= r["t1"] <= window[1]]
    t_first = min((r["t0"] for r in rows), default=0)
    timeline: dict[int, list[int]] = {}
    for r in rows:
        sec = timeline.setdefault(int(r["t1"] - t_first), [0, 0])
        sec[0 if r["ok"] else 1] += 1
    span = max((r["t1"] for r in rows), default=1) - t_first
    locust_rows = list(csv.DictReader(open(f"{prefix}_stats.csv"))) if Path(f"{prefix}_stats.csv").exists() else []
    chat_stats = next((r for r in locust_rows if r["Name"] == "chat"), {})
    lat = sorted(r["t1"] - r["t0"] for r in chat if r["ok"])
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else None  # noqa: E731
    return {
        "replicas": replicas, "users": users, "seconds": seconds, "fleet_up_s": up_s,
        "requests": len(rows), "chat_requests": len(chat), "ok": len(ok),
        "requests_per_s": len(ok) / span, "chat_per_s": sum(1 for r in chat if r["ok"]) / span,
        "latency_ms": {"locust": {q: float(chat_stats[q]) for q in ("50%", "95%", "99%") if q in chat_stats},
                       "own": {"50%": pct(0.5), "95%": pct(0.95), "99%": pct(0.99),
                               "mean": statistics.fmean(lat) * 1000 if lat else None}},
        "failed": len(failed), "failed_around_kill": len(around), "failed_elsewhere": len(failed) - len(around),
        "failure_statuses": sorted({r["status"] for r in failed}),
        "audit": report, "events": events, "final_status": final,
        "timeline": {str(k): v for k, v in sorted(timeline.items())},
        "locust_stats": locust_rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--model", default="nano")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        for n in args.replicas:
            print(f"{n} replica(s), {args.users} users, {args.minutes:g} min ...", flush=True)
            results.append(run(n, args.users, args.minutes, args.model, Path(tmp)))
    ms = lambda v: f"{v:.0f}" if v is not None else "-"  # noqa: E731
    rows = [["replicas", "users", "req/s (chat+feedback)", "chat p50 / p95 / p99 ms (locust)", "failed: around the "
             "kill / elsewhere", "lost traces", "unpromoted answers", "roll-out v1 / v2 s", "replica back after s"]]
    for r in results:
        lat, ev = r["latency_ms"]["locust"], r["events"]
        rows.append([str(r["replicas"]), str(r["users"]), f"{r['requests_per_s']:.1f}",
                     " / ".join(ms(lat.get(q)) for q in ("50%", "95%", "99%")),
                     f"{r['failed_around_kill']} / {r['failed_elsewhere']} of {r['requests']}",
                     f"{r['audit']['lost']} of {r['audit']['answered']}", str(len(r["audit"]["unpromoted"])),
                     " / ".join(f"{ev[k]['rollout_s']:.2f}" if ev.get(k, {}).get("rollout_s") is not None else "-"
                                for k in ("promote-1", "promote-2")),
                     f"{ev['kill']['replaced_s']:.1f}" if ev.get("kill", {}).get("replaced_s") else "-"])
    print(common.table(rows, title=f"fleet under load ({args.minutes:g} min per run, SIGKILL of one replica at "
                       "half-time, promotions at 1/4 and 3/4)"))
    # Where the two cores went, and what a replica serves per CPU-second: the projection to a
    # machine where each replica has a core of its own and the load comes from elsewhere.
    rows = [["replicas", "req/s", "CPU busy (of 2 cores)", "replicas' CPU", "locust's CPU", "the rest (proxy, "
             "Ray, PostgreSQL)", "req per replica CPU-second"]]
    for r in results:
        c = r["cpu"]
        rest = c["machine_busy_s"] - c["replicas_s"] - c["locust_s"]
        rows.append([str(r["replicas"]), f"{r['requests_per_s']:.1f}", f"{c['machine_busy_s'] / c['wall_s']:.2f}",
                     f"{c['replicas_s'] / c['wall_s']:.2f}", f"{c['locust_s'] / c['wall_s']:.2f}",
                     f"{rest / c['wall_s']:.2f}", f"{r['ok'] / c['replicas_s']:.1f}" if c["replicas_s"] else "-"])
    if len(results) == 2:
        ratio = results[1]["requests_per_s"] / results[0]["requests_per_s"]
        rows.append([f"{results[1]['replicas']} vs {results[0]['replicas']}", f"{ratio:.2f}x", "", "", "", "", ""])
    print(common.table(rows, title="where the CPU went (cores in use on average) and the scaling ratio"))
    common.save("serving/fleet", {"runs": results, "args": vars(args)})


if __name__ == "__main__":
    main()
