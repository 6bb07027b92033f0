"""verifiers environments through gymloop, for real: a v0 environment (tests/fixtures/vf_reverse,
written against verifiers' own API, its dataset built offline) loaded by verifiers'
`load_environment` in verifiers' runtime (`make verifiers`) and scored by its own Rubric. Its
rewards through gymloop equal its reward functions called directly; validate scores its answers
1.0 and wrong replies less; a GRPO run trains on it; bad options, a missing runtime, an unknown
environment and a dead bridge are clear errors."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import needs_runtime
from gymloop import runtimes
from gymloop.envs import make_env
from gymloop.envs.base import play

FIXTURES = str(Path(__file__).parent.parent / "fixtures")
OPTIONS = {"env": "vf-reverse", "path": FIXTURES}


@pytest.fixture(scope="module")
def env():
    needs_runtime("verifiers")
    e = make_env("verifiers", **OPTIONS)
    yield e
    e.close()


def direct(pairs: list[tuple[str, str]]) -> list[dict]:
    """The rubric's reward functions called directly in verifiers' runtime, weighted as it weights them."""
    script = """
import json, sys
sys.path.insert(0, sys.argv[1])
import verifiers as vf
group = vf.load_environment("vf-reverse").rubric          # the env's rubric and its own monitor rubric
funcs = [(f, w) for r in group.rubrics for f, w in zip(r.funcs, r.weights) if f.__name__ in ("exact", "prefix")]
out = []
for reply, answer in json.loads(sys.argv[2]):
    completion = [{"role": "assistant", "content": reply}]
    parts = {f.__name__: float(f(completion=completion, answer=answer)) for f, _ in funcs}
    out.append({"reward": sum(parts[f.__name__] * w for f, w in funcs), **parts})
print(json.dumps(out))
"""
    got = subprocess.run([str(runtimes.python("verifiers")), "-c", script, FIXTURES, json.dumps(pairs)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(got.strip().splitlines()[-1])


def test_the_rubric_through_gymloop_scores_as_its_functions_called_directly(env):
    tasks = env.sample_tasks(4, "heldout", 0) + env.sample_tasks(4, "train", 0)
    replies = [t.answer if i % 3 == 0 else t.answer[:i % 4] + "zz" if i % 3 == 1 else "" for i, t in enumerate(tasks)]
    ours = env.verify_batch([(t, play(env, t, [r])[0]) for t, r in zip(tasks, replies)])
    theirs = direct([(r, t.answer) for t, r in zip(tasks, replies)])
    for s, d in zip(ours, theirs):
        assert s.components["reward"] == d["reward"] and s.reward == min(1.0, d["reward"])
        assert s.components["exact"] == d["exact"] and s.components["prefix"] == d["prefix"]
    assert {s.reward for s in ours} != {ours[0].reward}                    # not one score for every reply


def test_validate_replies_with_the_answer_and_a_wrong_reply(capsys):
    from gymloop.cli import main

    needs_runtime("verifiers")
    assert main(["envs", "validate", "verifiers", "--options", json.dumps(OPTIONS), "--n", "6"]) == 0
    out = capsys.readouterr().out
    assert "gold 6/6 scored 1.0" in out and "known-wrong 6/6 scored < 1.0" in out


def test_grpo_trains_on_it(tmp_path, tiny_model_dir):
    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train
    from gymloop.tracking.run_dir import read_metrics

    needs_runtime("verifiers")
    cfg = TrainConfig.model_validate({
        "model": str(tiny_model_dir), "run_dir": str(tmp_path / "runs"),
        "env": {"name": "verifiers", "options": OPTIONS},
        "sampling": {"max_new_tokens": 8},
        "grpo": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "lr": 1e-3, "drop_zero_signal": False},
        "eval": {"tasks": 4, "every": 0, "max_new_tokens": 8}})
    summary = train(cfg, progress=False, echo=lambda m: None)
    trained = [r for r in read_metrics(summary["run_dir"]) if r.get("kind") == "train"]
    assert len(trained) == 3 and all(r["errors"] == 0 and 0 <= r["reward"] <= 1 for r in trained)
    assert summary["base"]["tasks"] == 4 and summary["final"]["tasks"] == 4


def test_bad_options_a_missing_runtime_an_unknown_environment_and_a_dead_bridge_are_errors(monkeypatch):
    from gymloop.envs.verifiers import VerifiersError

    with pytest.raises(ValueError, match="needs option env"):
        make_env("verifiers")
    needs_runtime("verifiers")
    with pytest.raises(VerifiersError, match="(?s)did not start.*no_such_env"):
        make_env("verifiers", env="no-such-env")
    env = make_env("verifiers", **OPTIONS)
    try:
        task = env.sample_tasks(1, "train", 0)[0]
        env.bridge.proc.kill()
        env.bridge.proc.wait()
        with pytest.raises(VerifiersError, match="exited"):
            env.verify(task, play(env, task, ["x"])[0])
    finally:
        env.close()
    monkeypatch.setenv("GYMLOOP_VERIFIERS_PYTHON", "/no/such/python")
    with pytest.raises(runtimes.RuntimeMissing, match="run `gymloop envs install verifiers`"):
        make_env("verifiers", **OPTIONS)
