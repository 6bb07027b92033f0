"""The whole-story demo's mechanics at toy size: a real server following the store, production
episodes through the openai client with verifier feedback, loop rounds that promote into the
running server, and the tool API changing mid-run. (That the change is detected as drift is
tested in test_loop.py: a toy model has no production successes to lose.)"""
from __future__ import annotations

import json
from pathlib import Path

from gymloop.cli import story_table
from gymloop.store import Store
from gymloop.jobs.story import StoryConfig, run_story


def test_story_serves_trains_and_switches_the_api(tmp_path, tiny_model_dir, store_target):
    """On SQLite and on PostgreSQL: the server, the loop and the audit below share the store."""
    cfg = StoryConfig(model=str(tiny_model_dir), rounds_before=1, rounds_after=1, requests_per_round=10,
                      concurrency=4, steps_per_round=2, prompts_per_step=2, eval_tasks=8, lr=1e-3,
                      store=store_target)
    summary = run_story(cfg, run_dir=tmp_path, progress=False, echo=lambda m: None)
    out = Path(summary["dir"])
    assert json.loads((out / "story.json").read_text())["rows"] == summary["rows"]
    rows = summary["rows"]
    assert [r["api"] for r in rows] == ["tools@v1", "tools@v3", "tools@v3"]    # 2 rounds + the final measure
    assert all(r["errors"] == 0 and r["episodes"] == 10 for r in rows)
    assert summary["store"] == ("postgres" if store_target.startswith("postgresql://") else "sqlite")
    store = Store(store_target)
    assert store.count("feedback") == 30 and store.count("traces") >= 30   # a trace per turn, a verdict per episode
    # every production answer names a version the store knows
    versions = {v["version"] for v in store.versions.list()}
    assert {r["served_version"] for r in rows} <= versions
    text = story_table(summary)
    assert "production success:" in text and text.count("tools@v3") >= 2
    # the rounds trained for the API of their time
    loop = json.loads((out / "story" / "summary.json").read_text())
    assert [r["target"] for r in loop["rounds"]] == ["tools@v1", "tools@v3"]
    assert (out / "story" / "report.html").exists()


def test_the_story_refuses_a_store_that_is_not_empty(tmp_path, tiny_model_dir):
    import pytest

    db = tmp_path / "used.db"
    Store(db).versions.add(str(tiny_model_dir), parent=None, status="promoted")
    with pytest.raises(ValueError, match="empty store"):
        run_story(StoryConfig(model=str(tiny_model_dir), store=str(db)), run_dir=tmp_path, progress=False,
                  echo=lambda m: None)
