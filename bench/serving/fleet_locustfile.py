"""Locust users of bench/serving/fleet.py: production traffic on a gymloop fleet. Each user asks
arithmetic questions (the arith environment's held-out tasks) through /v1/chat/completions,
grades the answer with the environment's verifier and sends it to /v1/feedback, as the demo's
customers do. Every request is also written to FLEET_BENCH_LOG (JSON lines: start, end, kind,
ok, status, trace id, model version), which the bench audits against the store.

    locust -f bench/fleet_locustfile.py --headless --host http://127.0.0.1:8000 -u 32 -r 32 -t 10m
"""
from __future__ import annotations

import json
import os
import random
import time

from locust import FastHttpUser, events, task

from gymloop.envs import make_env

ENV = make_env("arith")
TASKS = ENV.sample_tasks(500, "heldout", seed=0)
KEY = os.environ.get("FLEET_BENCH_KEY", "sk-bench")
MODEL = os.environ.get("FLEET_BENCH_MODEL", "gymloop-nano")
LOG = open(os.environ.get("FLEET_BENCH_LOG", os.devnull), "a", buffering=1)


def record(**row) -> None:
    LOG.write(json.dumps(row) + "\n")


class Customer(FastHttpUser):
    # closed loop with a short think time: each user has one request outstanding at most
    wait_time = lambda self: random.uniform(0.0, 0.2)  # noqa: E731

    @task
    def ask_and_grade(self) -> None:
        t = random.choice(TASKS)
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"model": MODEL, "messages": list(t.prompt), "max_tokens": 16, "temperature": 0}
        t0 = time.time()
        with self.client.post("/v1/chat/completions", json=body, headers=headers, name="chat",
                              catch_response=True) as r:
            ok = r.status_code == 200
            trace = r.headers.get("x-gymloop-trace-id") if ok else None
            version = int(r.headers.get("x-gymloop-model-version", -1)) if ok else None
            record(kind="chat", t0=t0, t1=time.time(), ok=ok, status=r.status_code, trace=trace, version=version)
            if not ok:
                r.failure(f"HTTP {r.status_code}")
                return
            reply = r.json()["choices"][0]["message"]["content"] or ""
        score = ENV.verify(t, [*t.prompt, {"role": "assistant", "content": reply}])
        fb = {"trace_id": trace, "reward": score.reward, "task": {"env": "arith", "task_id": t.id}}
        t0 = time.time()
        with self.client.post("/v1/feedback", json=fb, headers=headers, name="feedback", catch_response=True) as r:
            record(kind="feedback", t0=t0, t1=time.time(), ok=r.status_code == 200, status=r.status_code,
                   trace=trace, version=version)
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}")


@events.quitting.add_listener
def _close(environment, **kw) -> None:
    LOG.close()
