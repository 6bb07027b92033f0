"""The continuous loop: gate decisions, promotion into the store, crash-safe rounds."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gymloop.loop.config import GateConfig, LoopConfig
from gymloop.loop.gate import gate
from gymloop.loop.rounds import run_loop
from gymloop.store import Store

from conftest import DigitEnv, digit_loop_cfg, eventually, use_env


def test_gate_by_hand():
    g = GateConfig(delta=0.05, epsilon=0.02)
    assert gate({"a": 0.5, "b": 0.8}, {"a": 0.6, "b": 0.79}, "a", g)[0] is True
    ok, why = gate({"a": 0.5, "b": 0.8}, {"a": 0.6, "b": 0.70}, "a", g)
    assert not ok and "b fell by 0.100" in why
    ok, why = gate({"a": 0.5}, {"a": 0.53}, "a", g)
    assert not ok and "< delta" in why


def test_loop_promotes_a_better_model_and_rejects_the_rest(tmp_path, tiny_model_dir, monkeypatch):
    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    cfg = digit_loop_cfg(tmp_path, tiny_model_dir, rounds=2, gate={"delta": 0.2, "epsilon": 0.05})
    rounds = run_loop(cfg, echo=lambda m: None)
    store = Store(cfg.store)
    assert [r["round"] for r in rounds] == [1, 2]
    assert rounds[0]["status"] == "promoted" and rounds[0]["metrics"]["after"]["digit"] >= 0.9
    assert rounds[1]["status"] == "rejected"          # nothing left to gain by delta 0.2
    versions = {v["version"]: v for v in store.versions.list()}
    assert versions[1]["status"] == "promoted" and versions[1]["parent"] is None     # the base
    assert versions[2]["status"] == "promoted" and versions[2]["parent"] == 1
    assert versions[3]["status"] == "rejected" and versions[3]["parent"] == 2
    assert store.versions.promoted()["version"] == 2
    # a round's training does not evaluate: the gate measured before and after
    runs = list((Path(cfg.run_dir) / cfg.name).glob("round-*/summary.json"))
    assert len(runs) == 2 and all(json.loads(r.read_text())["base"] is None for r in runs)
    # resuming a finished loop does nothing more
    assert len(run_loop(cfg, echo=lambda m: None)) == 2


def test_latest_lineage_trains_on_from_a_rejected_candidate_but_serves_the_promoted(tmp_path, tiny_model_dir,
                                                                                    monkeypatch):
    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    cfg = digit_loop_cfg(tmp_path, tiny_model_dir, rounds=3, lineage="latest", gate={"delta": 0.2, "epsilon": 0.05})
    rounds = run_loop(cfg, echo=lambda m: None)
    store = Store(cfg.store)
    assert [r["status"] for r in rounds] == ["promoted", "rejected", "rejected"]
    versions = {v["version"]: v for v in store.versions.list()}
    assert [versions[r["metrics"]["version"]]["parent"] for r in rounds] == [1, 2, 3]   # 3 is rejected
    assert store.versions.promoted()["version"] == 2
    assert [r["metrics"]["served_version"] for r in rounds] == [1, 2, 2]
    # the gate compared each candidate with what was served
    assert rounds[2]["metrics"]["before"] == rounds[1]["metrics"]["before"]


def test_kill_9_mid_round_then_restart_commits_each_round_once(tmp_path, tiny_model_dir):
    cfg = {"model": str(tiny_model_dir), "store": str(tmp_path / "loop.db"), "run_dir": str(tmp_path / "runs"),
           "name": "crash", "rounds": 4, "env": {"name": "arith"}, "eval": {"tasks": 10,
           "max_new_tokens": 3}, "sampling": {"max_new_tokens": 3},
           "grpo": {"steps": 30, "prompts_per_step": 4, "group_size": 4, "drop_zero_signal": False}}
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "gymloop.cli", "run", str(path), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store = Store(cfg["store"])
    # kill once round 2 is training: its metrics file has a train record (an event, not a delay)
    def round_2_training() -> bool:
        return any('"kind": "train"' in m.read_text()
                   for m in (tmp_path / "runs" / "crash").glob("round-0002-*/metrics.jsonl"))

    eventually(round_2_training, 120, "round 2 trains",
               unless=lambda: proc.poll() is not None and f"the loop exited: {proc.stderr.read().decode()[-2000:]}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    killed_at = store.versions.last_round("crash")
    assert 1 <= killed_at < 4, proc.stderr.read().decode()[-2000:]
    done = subprocess.run(cmd, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    rounds = store.versions.rounds("crash")
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]            # none lost, none twice
    versions = {v["version"]: v for v in store.versions.list()}
    assert sorted(r["metrics"]["version"] for r in rounds) == sorted(v for v in versions if v != 1)
    promoted = store.versions.promoted()
    assert promoted is not None and os.path.exists(os.path.join(promoted["path"], "model.safetensors"))


def test_bad_loop_config_is_a_clear_error(tmp_path, capsys):
    from gymloop.cli import main

    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"rounds": 0, "gate": {"delta": -1}, "grpo": {"lr_schedule": "cosine"},
                                 "eval": {"tasks": 0}}))
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert "rounds" in err and "gate.delta" in err and "lr_schedule must be 'constant' in a loop" in err
    assert "eval.tasks is the gate's tasks per suite" in err
    # a file that is not YAML, or not a mapping, is a message too, never a traceback
    for text, needle in (("rounds: [1, 2\n", "is not valid YAML"), ("- a\n- b\n", "must hold a mapping")):
        p.write_text(text)
        assert main(["run", str(p)]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_production_failures_become_training_tasks(tmp_path, tiny_model_dir):
    from gymloop.envs import make_env

    store = Store(tmp_path / "loop.db")
    env = make_env("arith")
    failed = env.sample_tasks(3, "train", 7)
    for i, t in enumerate(failed):
        tid = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                              completion_tokens=1, latency_s=0.1)
        store.traces.add_feedback(tid, reward=0.0, env="arith", env_version=None, task_id=t.id)
    ok = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                         completion_tokens=1, latency_s=0.1)
    store.traces.add_feedback(ok, reward=1.0, env="arith", task_id="arith:1+1")            # a success: not a failure
    bad = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                          completion_tokens=1, latency_s=0.1)
    store.traces.add_feedback(bad, reward=0.0, env="arith", task_id="not-an-arith-id")     # unrebuildable: skipped
    cfg = LoopConfig.model_validate({
        "model": str(tiny_model_dir), "store": str(tmp_path / "loop.db"), "run_dir": str(tmp_path / "runs"),
        "name": "prod", "rounds": 1, "env": {"name": "arith"}, "eval": {"tasks": 10, "max_new_tokens": 3},
        "sampling": {"max_new_tokens": 3}, "curriculum": {"production_share": 0.5},
        "grpo": {"steps": 2, "prompts_per_step": 4, "group_size": 2, "drop_zero_signal": False}})
    rounds = run_loop(cfg, echo=lambda m: None)
    assert rounds[0]["metrics"]["curriculum"] == {"production_failures": 3, "production_per_step": 2,
                                                  "replay_per_step": 0, "production_not_rebuildable": 1}
    rows = store.traces.tasks()
    # failures, and the one success (kept for replay), are stored as production tasks
    assert {r["id"] for r in rows} == {t.id for t in failed} | {"arith:1+1"}
    assert {r["source"] for r in rows} == {"production"}
    assert store.traces.tasks(source="production")[0]["prompt"][0]["role"] == "user"


def _loop_cfg(tmp_path, tiny_model_dir, **kw):
    return LoopConfig.model_validate({
        "model": str(tiny_model_dir), "store": str(tmp_path / "loop.db"), "run_dir": str(tmp_path / "runs"),
        "name": "drift", "rounds": 1, "env": {"name": "arith"}, "eval": {"tasks": 10, "max_new_tokens": 3},
        "sampling": {"max_new_tokens": 3}, "curriculum": {"production_share": 0.25},
        "drift": {"window": 20, "failure_rise": 0.3, "production_share": 0.75},
        "grpo": {"steps": 2, "prompts_per_step": 4, "group_size": 2, "drop_zero_signal": False}, **kw})


def _feedback(store, task_id, reward, env="arith"):
    tid = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                          completion_tokens=1, latency_s=0.1)
    store.traces.add_feedback(tid, reward=reward, env=env, task_id=task_id)


def test_production_failure_spike_is_a_drift_event_and_shifts_the_curriculum(tmp_path, tiny_model_dir):
    from gymloop.envs import make_env

    store = Store(tmp_path / "loop.db")
    tasks = make_env("arith").sample_tasks(20, "train", 3)
    for t in tasks:
        _feedback(store, t.id, 1.0)           # the earlier window: all good
    for t in tasks:
        _feedback(store, t.id, 0.0)           # the latest window: all failing
    rounds = run_loop(_loop_cfg(tmp_path, tiny_model_dir), echo=lambda m: None)
    drift = rounds[0]["metrics"]["drift"]
    assert [(e["env"], e["kind"], e["before"], e["after"]) for e in drift] == [("arith", "production", 0.0, 1.0)]
    assert store.versions.drift_events()[0]["round"] == 1
    assert rounds[0]["metrics"]["curriculum"]["production_per_step"] == 3      # 0.75 of 4, not 0.25


def test_a_new_api_version_failing_after_the_old_one_worked_is_drift_of_the_new_version(tmp_path):
    from gymloop.loop.drift import detect_drift

    store = Store(tmp_path / "loop.db")
    cfg = LoopConfig.model_validate({"drift": {"window": 20, "failure_rise": 0.3}})
    for i in range(20):
        _feedback(store, f"tools:apple:{i}:1", float(i % 2), env="tools@v1")
    assert detect_drift(cfg.drift, cfg.name, store, 1, {}, {}) == []          # the first traffic has nothing to rise from
    for i in range(20):
        _feedback(store, f"tools:apple:{i}:1", 1.0, env="tools@v1")
    for i in range(20):
        _feedback(store, f"tools:apple:{i}:1", 0.0 if i % 10 else 1.0, env="tools@v2")
    events = detect_drift(cfg.drift, cfg.name, store, 3, {}, {})
    assert [(e["env"], e["kind"], e["before"], e["after"]) for e in events] == [("tools@v2", "production", 0.0, 0.9)]
    assert [(e["round"], e["env"]) for e in store.versions.drift_events()] == [(3, "tools@v2")]


def test_a_suite_that_dropped_since_promotion_is_a_drift_event(tmp_path, tiny_model_dir):
    store = Store(tmp_path / "loop.db")
    store.versions.add(str(tiny_model_dir), parent=None, status="promoted", scores={"arith": 0.95})
    rounds = run_loop(_loop_cfg(tmp_path, tiny_model_dir), echo=lambda m: None)
    events = rounds[0]["metrics"]["drift"]
    assert len(events) == 1 and events[0]["kind"] == "eval" and events[0]["before"] == 0.95
    assert events[0]["after"] == rounds[0]["metrics"]["before"]["arith"]


def test_store_migrates_an_older_database_without_losing_rows(tmp_path, monkeypatch):
    import gymloop.store.db as db_mod

    monkeypatch.setattr(db_mod, "MIGRATIONS", db_mod.MIGRATIONS[:1])
    old = Store(tmp_path / "old.db")
    tid = old.traces.add(model="m", model_version=0, request={"a": 1}, response={}, prompt_tokens=1,
                        completion_tokens=1, latency_s=0.0)
    assert old.schema_version == 1
    monkeypatch.undo()
    new = Store(tmp_path / "old.db")
    assert new.schema_version == len(db_mod.MIGRATIONS) >= 2
    assert new.traces.get(tid)["request"] == {"a": 1}
    new.versions.add_drift_event(env="arith", kind="eval", before=0.9, after=0.1)
    assert len(new.versions.drift_events()) == 1


def test_past_successes_are_replayed(tmp_path, tiny_model_dir):
    from gymloop.envs import make_env

    store = Store(tmp_path / "loop.db")
    good = make_env("arith").sample_tasks(5, "train", 4)
    for t in good:
        _feedback(store, t.id, 1.0)
    cfg = _loop_cfg(tmp_path, tiny_model_dir, curriculum={"production_share": 0.25, "replay_share": 0.5})
    rounds = run_loop(cfg, echo=lambda m: None)
    assert rounds[0]["metrics"]["curriculum"]["replay_per_step"] == 2
    assert {t["id"] for t in store.traces.tasks(source="production")} == {t.id for t in good}


def test_the_gate_evaluates_the_target_with_its_options(tmp_path):
    """A loop on arith with digits: 3 is gated on 3-digit tasks (the suite is built with the
    environment's options, not from its name alone)."""
    from gymloop.loop.gate import suite_envs

    cfg = LoopConfig(store=str(tmp_path / "g.db"), env={"name": "arith", "options": {"digits": 3}},
                     suites=["arith", "tools@v2"])
    envs = suite_envs(cfg)
    assert [e.name for e in envs] == ["arith", "tools@v2"]       # the target is not repeated
    tasks = envs[0].sample_tasks(50, "heldout", seed=0)
    assert envs[0].config.digits == 3 and max(len(t.id.split(":")[1].split("+")[0]) for t in tasks) == 3


@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_a_round_can_be_a_fine_tuning_job_on_production_traces(tmp_path, tiny_model_dir, monkeypatch, method):
    """Production answered the digit prompts with a digit (reward 1) or a letter (reward 0): a
    round of method sft / dpo exports those traces, trains on them, and the gate promotes it."""
    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    # 24 good answers for SFT; 6 prompts, so 6 (best, worst) pairs for DPO: more passes over them
    cfg = digit_loop_cfg(tmp_path, tiny_model_dir, round={"method": method, "n_epochs": 4 if method == "sft" else 30,
                                                         "batch_size": 8, "sft_weight": 1.0, "min_examples": 4,
                                                         "learning_rate_multiplier": 20}, gate={"delta": 0.2})
    store = Store(cfg.store)
    for i in range(48):
        prompt = "abcxyz"[(i // 2) % 6]       # each prompt answered both ways
        answer = "7" if i % 2 == 0 else "q"
        tid = store.traces.add(model="t", model_version=1, request={"messages": [{"role": "user", "content": prompt}]},
                              response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
                              prompt_tokens=1, completion_tokens=1, latency_s=0.0)
        store.traces.add_feedback(tid, reward=float(answer.isdigit()))
    (r,) = run_loop(cfg)
    m = r["metrics"]
    assert m["training"]["method"] == method and m["training"]["examples"] == (24 if method == "sft" else 6)
    assert m["training"]["loss_last"] < m["training"]["loss_first"]
    assert r["status"] == "promoted", (m["why"], m["training"])
    assert m["after"]["digit"] >= m["before"]["digit"] + 0.2
    assert any(row["phase"] == "fine_tuning" and row["trained_tokens"] > 0 for row in store.ledger.rows("fine_tuning"))


def test_a_fine_tuning_round_without_enough_traces_trains_nothing(tmp_path, tiny_model_dir, monkeypatch):
    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    (r,) = run_loop(digit_loop_cfg(tmp_path, tiny_model_dir, round={"method": "sft"}))
    assert r["status"] == "rejected" and r["metrics"]["training"]["skipped"].startswith("fewer than 8")
