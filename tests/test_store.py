"""The store's repositories: typed records that match what the tables hold, typed errors the API
maps to status codes, and the rows that travel with a commit (a job's cost, a round's ledger)."""
from __future__ import annotations

import typing

import pytest

from gymloop.accounting.rows import LedgerRow
from gymloop.store import Conflict, NotFound, Store, StoreError
from gymloop.store import records


def _keys(td) -> set[str]:
    return set(typing.get_type_hints(td))


@pytest.fixture()
def store(tmp_path):
    return Store(tmp_path / "s.db")


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
