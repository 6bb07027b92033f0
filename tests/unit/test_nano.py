"""nano pre-training: the seed enters the cache key, the probe band decides when to stop, the
probe's tasks never enter the corpus."""
from __future__ import annotations

import json
import random

import pytest

from gymloop.envs import make_env
from gymloop.bases import nano
from gymloop.bases.nano import NanoConfig, ProbeSpec, corpus_tasks, preset


def tiny(**kw) -> NanoConfig:
    return NanoConfig(hidden_size=16, heads=2, intermediate_size=32, layers=1, batch_size=4,
                      probe=ProbeSpec(tasks=8), **kw)


def test_seed_and_every_recipe_field_enter_the_cache_key():
    keys = {preset("nano", seed=s).key() for s in (0, 1, 2)}
    assert len(keys) == 3
    base = preset("nano")
    assert preset("nano", target_pass1=0.4).key() != base.key()
    assert preset("nano", lr_schedule="cosine").key() != base.key()
    assert preset("nano-tools").key() != base.key()
    assert preset("nano", seed=0).key() == base.key()          # same recipe, same cache entry


def test_cli_pretrain_seed_gives_its_own_base(tmp_path, capsys):
    from gymloop.cli import main

    paths = []
    for seed in (0, 1):
        assert main(["pretrain", "--seed", str(seed), "--steps", "2", "--cache-dir", str(tmp_path), "--quiet"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["seed"] == seed and out["steps"] == 2 and out["target_pass1"] is None
        paths.append(out["path"])
        saved = json.loads((tmp_path / "models" / out["path"].rsplit("/", 1)[1] / "gymloop.json").read_text())
        assert saved["nano_config"]["seed"] == seed
    assert paths[0] != paths[1]


def test_pretraining_stops_at_the_first_probe_that_reaches_the_target(monkeypatch):
    scores = iter([0.0, 0.1, 0.25, 0.6, 0.9])
    calls = []

    def fake_probe(model, tok, env, tasks, spec):
        calls.append(len(tasks))
        return next(scores)

    monkeypatch.setattr(nano, "probe_score", fake_probe)
    model, tok, stats = nano.pretrain(tiny(target_pass1=0.5, probe_every=2, steps=100), progress=False)
    assert stats["steps"] == 8 and stats["target_reached"] is True and stats["probe_pass1"] == 0.6
    assert [c["step"] for c in stats["probe_curve"]] == [2, 4, 6, 8] and calls == [8, 8, 8, 8]


def test_a_budget_that_runs_out_says_the_target_was_not_reached(monkeypatch):
    monkeypatch.setattr(nano, "probe_score", lambda *a: 0.0)
    _, _, stats = nano.pretrain(tiny(target_pass1=0.5, probe_every=2, steps=5), progress=False)
    assert stats["steps"] == 5 and stats["target_reached"] is False


def test_probe_tasks_never_enter_the_corpus():
    env = make_env("arith", digits=1)
    probe = {t.id for t in env.sample_tasks(20, "train", seed=3)}
    drawn = corpus_tasks([env], random.Random(0), 400, frozenset(probe))
    assert len(drawn) == 400 and not probe & {t.id for _, t in drawn}
    assert all(t.split == "train" for _, t in drawn)


def test_a_probe_outside_the_corpus_is_a_clear_error():
    with pytest.raises(ValueError, match="probe environment 'tools' is not in the corpus"):
        NanoConfig(probe=ProbeSpec(name="tools"))
    NanoConfig(probe=ProbeSpec(name="tools"), target_pass1=None)     # no probe band, no check


def test_nano_model_spec_takes_a_seed(tmp_path, monkeypatch):
    from gymloop.bases.registry import resolve_model

    seen = []
    monkeypatch.setattr(nano, "ensure_nano", lambda cfg, cache_dir=None, progress=True: seen.append(cfg) or tmp_path)
    resolve_model("nano-tools:seed=2")
    assert seen[-1].seed == 2 and seen[-1].key() == preset("nano-tools", seed=2).key()
    with pytest.raises(ValueError, match="the only nano option is seed"):
        resolve_model("nano:steps=3")
