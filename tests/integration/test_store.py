"""The store's repositories on both back-ends (SQLite, and a real PostgreSQL the session starts):
typed records that match what the tables hold, typed errors the API maps to status codes, the rows
that travel with a commit (a job's cost, a round's ledger), group commit under concurrency, job
claims that never give one job to two workers, promotions announced, nothing lost on reopening."""
from __future__ import annotations

import typing

import pytest

from gymloop.accounting.rows import LedgerRow
from gymloop.store import Conflict, NotFound, Store, StoreError
from gymloop.store import records


def _keys(td) -> set[str]:
    return set(typing.get_type_hints(td))


@pytest.fixture()
def store(store_target):
    """A store on each back-end (conftest's store_target: SQLite, then a real PostgreSQL)."""
    s = Store(store_target)
    yield s
    s.close()


def test_every_record_has_exactly_its_typed_fields(store):
    tid = store.traces.add(model="m", model_version=1, request={"messages": []}, response={"id": "x"},
                           prompt_tokens=3, completion_tokens=2, latency_s=0.1)
    store.traces.add_feedback(tid, reward=1.0, env="arith", task_id="t1")
    v = store.versions.add("/m", None, "promoted", {"arith": 0.5})
    store.versions.ensure_run("loop", {})
    store.versions.commit_round("loop", 1, path="/c", parent=v, status="rejected", scores={}, metrics={"why": "x"},
                                started=0.0, ledger_rows=[LedgerRow("training", 2.0, dollars=0.1, trained_tokens=5)])
    store.versions.add_drift_event(env="arith", kind="eval", before=0.9, after=0.2)
    f = store.files.add(tenant="t", filename="a.jsonl", purpose="fine-tune", content=b"{}\n", status="processed",
                        status_details=None, kind="sft", examples=1)
    j = store.jobs.add(tenant="t", model="nano", training_file=f["id"], validation_file=None, suffix=None, seed=1,
                       metadata={}, method={"type": "supervised"}, hyperparameters={})
    store.jobs.add_checkpoint(j["id"], step=1, path="/p", model_id="ft:x:ckpt-1", metrics={"step": 1}, state={})
    got = {
        records.Trace: store.traces.get(tid), records.Feedback: store.traces.feedback_for(tid)[0],
        records.GradedTrace: store.traces.graded()[0], records.FeedbackTask: store.traces.production_successes()[0],
        records.ModelVersion: store.versions.get(v), records.Round: store.versions.rounds("loop")[0],
        records.DriftEvent: store.versions.drift_events()[0], records.LedgerRecord: store.ledger.rows()[0],
        records.FileRecord: store.files.get("t", f["id"]), records.Job: store.jobs.get("t", j["id"]),
        records.JobEvent: store.jobs.events(j["id"])[0][0], records.Checkpoint: store.jobs.checkpoints(j["id"])[0][0],
    }
    for td, rec in got.items():
        assert set(rec) == _keys(td), td.__name__
    assert got[records.Round]["metrics"] == {"why": "x", "version": v + 1}         # JSON columns come decoded
    assert got[records.LedgerRecord]["run_id"] == "loop" and got[records.LedgerRecord]["round"] == 1


def test_refusals_are_typed(store):
    with pytest.raises(NotFound):
        store.traces.add_feedback("trace-nope", reward=1.0)
    tid = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                           completion_tokens=1, latency_s=0.0)
    with pytest.raises(StoreError) as bad:
        store.traces.add_feedback(tid, reward=2.0)
    assert type(bad.value) is StoreError                      # a bad value: neither missing nor conflicting
    with pytest.raises(NotFound):
        store.versions.set_status(99, "promoted")
    v = store.versions.add("/m", None, "rejected")
    with pytest.raises(Conflict, match="never promoted"):
        store.versions.rollback_to(v)
    assert store.versions.get(v)["status"] == "rejected"      # nothing changed


def test_a_job_update_writes_its_ledger_row_once(store):
    j = store.jobs.add(tenant="t", model="nano", training_file="file-1", validation_file=None, suffix=None, seed=1,
                       metadata={}, method={"type": "supervised"}, hyperparameters={})
    row = LedgerRow("fine_tuning", 3.0, dollars=0.2, run_id=j["id"], trained_tokens=10)
    assert store.jobs.update(j["id"], status="succeeded", when_status=("queued",), ledger_row=row)
    assert not store.jobs.update(j["id"], status="succeeded", when_status=("queued",), ledger_row=row)
    assert [r["trained_tokens"] for r in store.ledger.rows("fine_tuning")] == [10]


def test_group_commit_keeps_every_concurrent_trace_and_its_feedback(store):
    """64 traces from 8 threads through the group commit: each future resolves once its row is
    committed, and every one is there, with its feedback and the stats over it."""
    from concurrent.futures import ThreadPoolExecutor

    def answer(i: int) -> str:
        fut = store.traces.add_committed(model="m", model_version=1, request={"i": i}, response={"i": i},
                                         prompt_tokens=2, completion_tokens=3, latency_s=0.01)
        tid = fut.result(timeout=60)
        store.traces.add_feedback(tid, reward=float(i % 2), env="arith", env_version=1, task_id=f"t{i % 5}")
        return tid

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(answer, range(64)))
    assert len(set(ids)) == 64 and store.count("traces") == 64 and store.count("feedback") == 64
    assert all(store.traces.get(t)["request"]["i"] == i for i, t in enumerate(ids))
    assert len(store.traces.graded()) == 64
    rate, prior, n, n_prior = store.traces.failure_rates(window=32)["arith@v1"]
    assert (n, n_prior) == (32, 32) and 32 * rate + 32 * prior == 32     # which window holds which: thread order
    assert store.traces.production_success(0, 1e12) == {"arith@v1": (32, 64)}
    assert {t["task_id"] for t in store.traces.production_failures()} == {f"t{i}" for i in range(5)}
    stats = store.ledger.stats()
    assert (stats["traces"], stats["served_tokens"], stats["feedback"], stats["failures"]) == (64, 192, 64, 32)


def test_ledger_sums_and_files_round_trip(store):
    store.versions.ensure_run("loop", {"x": 1})
    for r in (1, 2):
        store.versions.commit_round("loop", r, path=f"/c{r}", parent=None, status="rejected", scores={}, metrics={},
                                    started=0.0, ledger_rows=[LedgerRow("training", 2.0 * r, dollars=0.5, trained_tokens=10 * r),
                                                              LedgerRow("sampling", 1.0, dollars=0.1, generated_tokens=7)])
    costs = store.ledger.round_costs("loop")
    assert costs[2]["training"]["trained_tokens"] == 20 and costs[1]["sampling"]["generated_tokens"] == 7
    assert isinstance(costs[2]["training"]["seconds"], float) and store.versions.last_round("loop") == 2
    store.ledger.add(LedgerRow("fine_tuning", 4.0, dollars=0.4, trained_tokens=400))
    assert store.ledger.fine_tuning_rate() == pytest.approx({"jobs": 1, "tokens_per_second": 100.0,
                                                             "dollars_per_token": 0.001})
    blob = bytes(range(256)) * 3
    ids = [store.files.add(tenant="t", filename=f"{i}.jsonl", purpose="fine-tune", content=blob, status="processed",
                           status_details=None, kind="sft", examples=1)["id"] for i in range(3)]
    assert store.files.content("t", ids[0]) == blob and store.files.content("u", ids[0]) is None
    page, more = store.files.list("t", limit=2)
    assert [f["id"] for f in page] == ids[::-1][:2] and more
    assert store.files.delete("t", ids[1]) and not store.files.delete("t", ids[1])


def test_concurrent_workers_never_claim_one_job_twice(store):
    """8 workers claim from 20 queued jobs at once: every job is taken exactly once; a running job
    is taken over only when its worker is gone."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [store.jobs.add(tenant="t", model="nano", training_file="f", validation_file=None, suffix=None, seed=i,
                           metadata={}, method={"type": "supervised"}, hyperparameters={})["id"] for i in range(20)]
    alive = lambda worker, heartbeat, now: False        # noqa: E731 - every worker is alive

    def work(w: int) -> list[str]:
        got = []
        while (job := store.jobs.claim(f"w{w}", alive)) is not None:
            got.append(job["id"])
        return got

    with ThreadPoolExecutor(8) as pool:
        claimed = [j for got in pool.map(work, range(8)) for j in got]
    assert sorted(claimed) == sorted(jobs)                             # each once, none left out
    assert {store.jobs.get(None, j)["status"] for j in jobs} == {"running"}
    assert all(len([e for e in store.jobs.events(j)[0] if e["message"] == "Fine-tuning job started"]) == 1
               for j in jobs)
    gone = store.jobs.get(None, jobs[0])["worker"]          # whichever thread took it: its worker dies
    taken = store.jobs.claim("w-new", lambda worker, heartbeat, now: worker == gone)
    assert taken is not None and store.jobs.get(None, taken["id"])["worker"] == "w-new"


def test_a_promotion_is_announced_and_everything_survives_reopening(store, store_target):
    v = store.versions.add("/m", None, "candidate")
    import threading

    heard: list[bool] = []
    if store.db.dialect == "postgres":
        store.wait_for_promotion(timeout=0.01)   # LISTEN from here on: what is announced waits for the next call
    patience = 30 if store.db.dialect == "postgres" else 0.05
    listener = threading.Thread(target=lambda: heard.append(store.wait_for_promotion(timeout=patience)))
    store.versions.set_status(v, "promoted")
    listener.start()
    listener.join()
    assert heard == [store.db.dialect == "postgres"]       # LISTEN/NOTIFY; SQLite's followers poll
    schema = store.schema_version
    store.close()
    again = Store(store_target)
    assert again.versions.promoted()["version"] == v and again.schema_version == schema
    again.close()


def test_a_lost_listen_connection_is_a_missed_wait_then_listens_again(postgres_server):
    """The server drops the follower's LISTEN connection (a restart, a failover): that wait ends
    as a timeout instead of killing the follower, and the next wait hears promotions again."""
    import threading

    import psycopg

    store = Store(postgres_server())
    store.wait_for_promotion(timeout=0.01)                       # listening
    with psycopg.connect(store.url, autocommit=True) as admin:
        # this test's database only: the session's server also holds other tests' listeners
        killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE query LIKE 'LISTEN%' AND datname = current_database()").fetchall()
    assert killed == [(True,)]
    assert store.wait_for_promotion(timeout=0.05) is False       # the lost connection, not an exception
    store.wait_for_promotion(timeout=0.01)                       # listening again
    heard: list[bool] = []
    listener = threading.Thread(target=lambda: heard.append(store.wait_for_promotion(timeout=30)))
    store.versions.add("/m", None, "promoted")
    listener.start()
    listener.join()
    assert heard == [True]
    store.close()


def test_session_verdicts_are_a_production_failure_rate_the_drift_detector_reads(store_target):
    from gymloop.loop.config import DriftConfig
    from gymloop.loop.drift import detect_drift

    store = Store(store_target)
    store.versions.ensure_run("r", {})
    call = {"messages": [{"role": "user", "content": "hi"}], "tools": None, "prompt_ids": [1], "token_ids": [2],
            "logprobs": [-0.1], "reply": {"role": "assistant", "content": "x"}, "version": 1, "ended": True}
    for i, reward in enumerate([1.0] * 10 + [0.0] * 8 + [1.0] * 2):
        store.sessions.add_calls(f"s{i}", f"t{i}", None, [call], None)
        store.sessions.add_feedback(f"s{i}", reward)
    assert store.sessions.failure_rates(10) == {"agent": (0.8, 0.0, 10, 10)}
    assert store.sessions.get("s3")["task"] == {"id": "s3", "input": "hi"}        # its first user input
    events = detect_drift(DriftConfig(window=10, failure_rise=0.2), "r", store, 1, {}, {})
    assert events == [{"env": "agent", "kind": "production", "before": 0.0, "after": 0.8}]
