"""The demo's chapters run their YAML configs (configs/demo-*.yaml), and those are the settings
of the runs whose numbers the README shows (docs/runs/)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gymloop.config import TrainConfig
from gymloop.demos import CHAPTERS, CONFIGS, chapter_config, seeded
from gymloop.demos.loop import LoopDemoConfig, round_config
from gymloop.demos.program import ProgramDemoConfig

RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_chapter_is_a_valid_config_in_configs(chapter):
    cfg = chapter_config(chapter)
    assert (CONFIGS / CHAPTERS[chapter]).exists()
    assert isinstance(cfg, {"learn": TrainConfig, "program": ProgramDemoConfig}.get(chapter, LoopDemoConfig))


def test_the_learn_chapter_is_the_readme_runs_config():
    """The resolved config.yaml the README's chapter-1 run wrote, but for its run directory."""
    recorded = yaml.safe_load((RUNS / "demo-learn-2026-12-06-config.yaml").read_text())
    cfg = chapter_config("learn").model_copy(update={"model": seeded("nano", 0), "run_dir": recorded["run_dir"]})
    assert cfg.model_dump(mode="json") == TrainConfig.model_validate(recorded).model_dump(mode="json")


def test_the_loop_chapter_is_the_readme_runs_config():
    """The chapter's config as the README's chapter-2 run recorded it in its story.json, and the
    loop config its rounds run."""
    recorded = json.loads((RUNS / "demo-loop-2026-12-06.json").read_text())["config"]
    cfg = chapter_config("loop").model_copy(update={"model": seeded("nano-tools", 0)})
    assert cfg.model_dump(mode="json") == LoopDemoConfig.model_validate(recorded).model_dump(mode="json")
    one = round_config(cfg, Path("out"), "base-dir", cfg.api_before, 1, "story.db")
    assert (one.model, one.store, one.rounds, one.env.options) == ("base-dir", "story.db", 1, {"version": 1, "schemas": False})
    assert one.drift.window == cfg.requests_per_round and one.gate == cfg.loop.gate and one.grpo == cfg.loop.grpo


# The agent runs (2026-12-04) recorded the chapter's config when it copied the loop's fields flat:
# where each of those fields lives in the loop config now.
FLAT_TO_LOOP = {"steps_per_round": "grpo.steps", "prompts_per_step": "grpo.prompts_per_step",
                "warmup_steps": "grpo.warmup_steps", "group_size": "grpo.group_size", "train_only": "grpo.train_only",
                "micro_batch": "grpo.micro_batch", "dynamic_sampling": "grpo.dynamic_sampling",
                "max_refills": "grpo.max_refills", "reward_weights": "grpo.reward_weights", "lr": "grpo.lr",
                "production_share": "curriculum.production_share", "drift_production_share": "drift.production_share",
                "temperature": "sampling.temperature", "max_new_tokens": "sampling.max_new_tokens",
                "eval_tasks": "eval.tasks", "engine_dtype": "engine_dtype", "seed": "seed"}


@pytest.mark.parametrize("run", ["agent-story-2026-12-04-20", "agent-story-2026-12-04-21", "agent-story-2026-12-04-22"])
def test_the_agent_chapter_is_the_readme_runs_config(run):
    flat = json.loads((RUNS / f"{run}.json").read_text())["config"]
    cfg = chapter_config("agent", overrides={"loop": {"seed": flat["seed"]}})
    loop = cfg.loop.model_dump(mode="json")
    for field, path in FLAT_TO_LOOP.items():
        value = loop
        for part in path.split("."):
            value = value[part]
        assert value == flat[field], field
    assert loop["eval"]["max_new_tokens"] == flat["max_new_tokens"]
    story = cfg.model_dump(mode="json", exclude={"loop"})
    assert story == {k: v for k, v in flat.items() if k not in FLAT_TO_LOOP}
