"""The serving fleet: replicas' heartbeats and the audit on both store back-ends, the in-flight
count, and end to end `gymloop fleet up --replicas 2 --embedded-db` (real Ray Serve, real
PostgreSQL, the openai client): traffic while a version is promoted and a replica is SIGKILLed,
then every answered request's trace is in the store and no unpromoted version answered."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import eventually, free_port
from gymloop.cli import main
from gymloop.fleet.audit import audit, replaced, rollout_seconds
from gymloop.store import Store


def _replica(rid: str, version: int = 0, **kw) -> dict:
    now = time.time()
    return {"id": rid, "fleet": "f", "host": "h", "pid": 1, "started": now, "seen": now, "version": version,
            "version_since": now, "in_flight": 0, "answered": 0, **kw}


def test_replica_heartbeats_and_the_audit(store_target):
    store = Store(store_target)
    store.replicas.beat(_replica("a"))
    store.replicas.beat(_replica("b"))
    store.replicas.beat(_replica("a", in_flight=3))                 # a heartbeat replaces the row
    assert sorted((r["id"], r["in_flight"]) for r in store.replicas.list(fleet="f")) == [("a", 3), ("b", 0)]
    assert store.replicas.list(fleet="other") == []
    v1 = store.versions.add("/m1", parent=None, status="promoted")
    v2 = store.versions.add("/m2", parent=None)                       # a candidate: never served
    assert store.versions.get(v1)["promoted_at"] is not None and store.versions.get(v2)["promoted_at"] is None
    assert rollout_seconds(store, "f", v1) is None                      # no replica serves v1 yet
    for rid in ("a", "b"):
        store.replicas.beat(_replica(rid, version=v1))
    assert rollout_seconds(store, "f", v1) >= 0
    assert replaced(store, "f", killed_pid=999, replicas=2, version=v1)
    assert not replaced(store, "f", killed_pid=1, replicas=2)          # pid 1 still reports: not replaced
    assert not replaced(store, "f", killed_pid=999, replicas=2, version=v2)
    t = store.traces.add(model="m", model_version=v1, request={}, response={}, prompt_tokens=1,
                         completion_tokens=1, latency_s=0.1)
    report = audit(store, [(t, v1), ("chatcmpl-missing", v1), (t, v2)])
    assert report["answered"] == 3 and report["lost"] == 1 and report["unpromoted"] == [v2]
    assert report["versions"] == {str(v1): 2, str(v2): 1}
    store.replicas.remove("a")
    assert store.replicas.forget("f") == 1 and store.count("replicas") == 0


def test_in_flight_counts_a_request_until_its_last_byte():
    """The in-flight count (/metrics' gymloop_requests_in_flight, the heartbeat's in_flight) holds
    a streamed answer until its last body message is sent, and a failed one until it fails;
    other paths (/healthz, /metrics) are not counted."""
    import asyncio

    from gymloop.serve.metrics import InFlight

    class Metrics:
        in_flight = 0

    seen: list[int] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        seen.append(metrics.in_flight)                  # between the chunks: still in flight
        if scope["path"] == "/v1/fail":
            raise RuntimeError("the engine died")
        await send({"type": "http.response.body", "body": b"b"})
        seen.append(metrics.in_flight)                  # after the last one: done

    async def send(message):
        pass

    async def call(path: str) -> None:
        await InFlight(app, metrics)({"type": "http", "path": path}, None, send)

    metrics = Metrics()
    asyncio.run(call("/v1/chat/completions"))
    assert seen == [1, 0] and metrics.in_flight == 0
    with pytest.raises(RuntimeError):
        asyncio.run(call("/v1/fail"))
    assert seen[2:] == [1] and metrics.in_flight == 0
    asyncio.run(call("/healthz"))
    assert seen[3:] == [0, 0]


def _gymloop(*args: str, timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, "-m", "gymloop.cli", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def _perturbed_copy(src: Path, dst: Path) -> Path:
    """Another version of the same model (its weights nudged): what a promotion would bring."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    g = torch.Generator().manual_seed(7)
    save_file({k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
               for k, v in weights.items()}, str(dst / "model.safetensors"))
    return dst


def test_fleet_promotes_under_traffic_and_survives_a_killed_replica(tmp_path, tiny_model_dir, capsys):
    """Also: a fine-tuning job sent to the fleet is run by its job worker (a Ray actor), and its
    model is then served by the fleet's replicas."""
    import io

    import openai

    state, port = tmp_path / "fleet", free_port()
    common = ["--state-dir", str(state)]
    _gymloop("fleet", "up", "--replicas", "2", "--workers", "1", "--embedded-db", "--model", str(tiny_model_dir),
             "--model-name", "tiny", "--api-key", "sk-fleet", "--port", str(port), "--jobs-dir", str(tmp_path / "jobs"),
             *common)
    try:
        st = json.loads(_gymloop("fleet", "status", "--json", *common))
        assert len(st["replicas"]) == 2 and all(r["healthy"] for r in st["replicas"])
        assert st["serve"]["status"] == "RUNNING"
        store = Store(st["db"])
        client = openai.OpenAI(base_url=st["url"], api_key="sk-fleet", max_retries=0, timeout=60)
        rows = [{"messages": [{"role": "user", "content": f"{i % 7}+1="}, {"role": "assistant", "content": str(i % 7 + 1)}]}
                for i in range(16)]
        f = client.files.create(file=("t.jsonl", io.BytesIO("\n".join(json.dumps(r) for r in rows).encode())),
                                purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method={
            "type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 4}}})
        answered, failed, stop = [], [], threading.Event()

        def user(i: int) -> None:
            while not stop.is_set():
                try:
                    r = client.chat.completions.with_raw_response.create(
                        model="tiny", messages=[{"role": "user", "content": f"{i} hello"}], max_tokens=8)
                    answered.append((r.headers["x-gymloop-trace-id"], int(r.headers["x-gymloop-model-version"]),
                                     time.time()))
                except openai.APIError as exc:
                    failed.append((type(exc).__name__, time.time()))

        users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(4)]
        for u in users:
            u.start()
        eventually(lambda: len(answered) >= 8, 120, "the fleet answers the users")
        # in this process (a CLI process starts slowly while the fleet takes traffic on 2 cores)
        capsys.readouterr()
        assert main(["models", "add", str(_perturbed_copy(tiny_model_dir, tmp_path / "v1")), "--promote",
                     "--db", st["db"]]) == 0
        promoted = json.loads(capsys.readouterr().out)["version"]
        rollout, = eventually(lambda: (lambda s: s is not None and (s,))(rollout_seconds(store, "gymloop", promoted)),
                              60, "the promotion rolls out", every_s=0.5)
        killed = st["replicas"][0]["pid"]
        kill_time = time.time()
        os.kill(killed, signal.SIGKILL)
        # Ray Serve replaces it; the new replica starts on the promoted version
        replaced_at = eventually(lambda: replaced(store, "gymloop", killed, 2, promoted) and time.time(), 120,
                                 "Ray Serve replaces the killed replica", every_s=0.5)
        # traffic goes on after the replacement: answers come back after it
        eventually(lambda: sum(t > replaced_at for _, _, t in answered) >= 4, 60, "answers after the replacement")
        stop.set()
        for u in users:
            u.join(60)
        done = eventually(lambda: _finished(client, job.id), 180, "the fleet's worker finishes the job", every_s=0.5)
        assert done.status == "succeeded", done.error
        tuned = client.chat.completions.create(model=done.fine_tuned_model, messages=[{"role": "user", "content": "3+1="}],
                                               max_tokens=4)
        assert tuned.model == done.fine_tuned_model
        report = audit(store, [(t, v) for t, v, _ in answered])
        print(f"fleet: {len(answered)} answered, {len(failed)} failed (after the kill), roll-out {rollout:.2f} s")
        assert report["lost"] == 0 and report["unpromoted"] == []
        assert str(promoted) in report["versions"]
        assert all(t >= kill_time for _, t in failed), failed         # failures only once a replica died
        assert any(t > kill_time for *_, t in answered)                # and the fleet answered after it
        assert rollout >= 0
        st = json.loads(_gymloop("fleet", "status", "--json", *common))
        assert [r["version"] for r in st["replicas"] if r["healthy"]] == [promoted, promoted]
        assert killed not in {r["pid"] for r in st["replicas"] if r["healthy"]}
    finally:
        head = json.loads((state / "fleet.json").read_text())["ray_address"]
        _gymloop("fleet", "down", *common)
    assert not (state / "fleet.json").exists()
    # this machine's "current Ray cluster" is not the stopped head: a plain ray.init() starts its own
    from ray._private.utils import read_ray_address

    current = read_ray_address()
    assert current is None or current.rsplit(":", 1)[-1] != head.rsplit(":", 1)[-1]


def _finished(client, job_id: str):
    job = client.fine_tuning.jobs.retrieve(job_id)
    return job if job.status in ("succeeded", "failed", "cancelled") else None


