"""The loop chapters' mechanics at toy size: a real server following the store, production
episodes through the openai client with verifier feedback, loop rounds that promote into the
running server, and the tool API changing mid-run. (That the change is detected as drift is
tested in test_loop.py: a toy model has no production successes to lose.)"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from gymloop.cli import story_table
from gymloop.store import Store
from gymloop.demos import chapter_config
from gymloop.demos.loop import LoopDemoConfig, run_loop_demo


def toy(cfg: LoopDemoConfig, **story) -> LoopDemoConfig:
    """`cfg` at toy size: few requests, rounds of 1-2 tiny GRPO steps, a small gate."""
    loop = cfg.loop.model_dump()
    loop["grpo"].update(steps=story.pop("steps", 2), prompts_per_step=2, micro_batch=0, train_only=[])
    loop["eval"].update(tasks=8)
    loop["sampling"].update(story.pop("sampling", {}))
    return LoopDemoConfig.model_validate({**cfg.model_dump(), "requests_per_round": 10, "concurrency": 4,
                                          **story, "loop": loop})


def test_story_serves_trains_and_switches_the_api(tmp_path, tiny_model_dir, store_target):
    """On SQLite and on PostgreSQL: the server, the loop and the audit below share the store."""
    cfg = toy(chapter_config("loop"), model=str(tiny_model_dir), rounds_after=1, store=store_target)
    summary = run_loop_demo(cfg, run_dir=tmp_path, progress=False, echo=lambda m: None)
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
    assert sum(v["episodes"] for v in summary["by_version"]) == 30 and "passes pooled" in text
    # the rounds trained for the API of their time
    loop = json.loads((out / "story" / "summary.json").read_text())
    assert [r["target"] for r in loop["rounds"]] == ["tools@v1", "tools@v3"]
    assert (out / "story" / "report.html").exists()


def test_production_is_pooled_by_served_version():
    from gymloop.demos.loop import by_version

    rows = [{"api": "calls", "served_version": 1, "production_success": 0.9, "episodes": 10},
            {"api": "calls@v2", "served_version": 1, "production_success": 0.5, "episodes": 10},
            {"api": "calls@v2", "served_version": 2, "production_success": 0.75, "episodes": 20},
            {"api": "calls@v2", "served_version": 2, "production_success": 0.5, "episodes": 20}]
    assert by_version(rows) == [{"api": "calls", "version": 1, "episodes": 10, "success": 0.9},
                                {"api": "calls@v2", "version": 1, "episodes": 10, "success": 0.5},
                                {"api": "calls@v2", "version": 2, "episodes": 40, "success": 0.625}]


def test_the_story_refuses_a_store_that_is_not_empty(tmp_path, tiny_model_dir):
    import pytest

    db = tmp_path / "used.db"
    Store(db).versions.add(str(tiny_model_dir), parent=None, status="promoted")
    with pytest.raises(ValueError, match="empty store"):
        run_loop_demo(LoopDemoConfig(model=str(tiny_model_dir), store=str(db)), run_dir=tmp_path, progress=False,
                      echo=lambda m: None)


def test_the_agent_story_measures_the_first_api_then_trains_after_the_schemas_change(tmp_path, tiny_model_dir):
    """The agent chapter's shape (configs/demo-agent.yaml) at toy size: `calls` with the schemas in
    every request, nothing trained on the first API (rounds_before 0), rounds on calls@v2."""
    cfg = toy(chapter_config("agent"), model=str(tiny_model_dir), rounds_after=1, steps=1,
              sampling={"max_new_tokens": 12})
    summary = run_loop_demo(cfg, run_dir=tmp_path, progress=False, echo=lambda m: None)
    rows = summary["rows"]
    assert [r["api"] for r in rows] == ["calls", "calls@v2", "calls@v2"]
    assert "status" not in rows[0] and rows[1]["round"] == 1 and "status" not in rows[2]
    assert all(r["errors"] == 0 and r["episodes"] == 10 for r in rows)
    loop = json.loads((Path(summary["dir"]) / "story" / "summary.json").read_text())
    assert [r["target"] for r in loop["rounds"]] == ["calls@v2"]
    round_cfg = yaml.safe_load(next((Path(summary["dir"]) / "story").glob("round-0001-*/config.yaml")).read_text())
    assert round_cfg["engine_dtype"] == "bfloat16" and round_cfg["grpo"]["dynamic_sampling"] is True
    store = Store(Path(summary["dir"]) / "story.db")
    # production's requests carried the version's schemas
    from gymloop.envs import make_env

    graded = store.traces.graded()
    assert {g["env"] for g in graded} == {"calls", "calls@v2"} and len(graded) == 30
    for g in graded:
        env = make_env(g["env"], heldout="requests")
        assert g["request"]["tools"] == env.tools(env.task_from_id(g["task_id"]))
    assert story_table(summary).splitlines()[2].lstrip("| ").startswith("-")


def test_a_story_refuses_an_api_version_its_environment_lacks():
    import pytest

    from gymloop.config import ConfigError

    with pytest.raises(ConfigError, match=r"calls has API versions \[1, 2\], not 3"):
        chapter_config("agent", overrides={"api_after": 3})


def test_a_base_built_by_a_supervised_job_through_the_api(tmp_path, tiny_model_dir):
    """demos/smollm2_calls.fine_tune, the agent chapter's base builder, at toy size: demonstrations
    in OpenAI's function-calling format, a LoRA job through the server, the merged model copied
    under its cached name with the finished job beside it."""
    from gymloop.demos.smollm2_calls import demonstrations, fine_tune, recipe_key, RECIPE
    from gymloop.models.checkpoint import load_model

    rows = demonstrations({**RECIPE, "rows": 3})
    assert all(r["messages"][-1]["tool_calls"] and r["tools"] for r in rows)
    out = tmp_path / f"smollm2-calls-{recipe_key()}"
    info = fine_tune(tiny_model_dir, rows, {"rank": 2, "alpha": 4.0}, out, progress=False)
    assert info["job"]["status"] == "succeeded" and info["job"]["trained_tokens"] > 0
    assert json.loads((out / "gymloop.json").read_text())["job"]["id"] == info["job"]["id"]
    load_model(out)                               # a plain model directory, the adapter merged
    assert not out.with_name(out.name + ".partial").exists()
    assert recipe_key() != recipe_key({**RECIPE, "rows": 3})
