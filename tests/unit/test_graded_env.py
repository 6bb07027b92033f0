"""The `graded` environment: prompts of a reinforcement file scored by a grader, python graders
batched into one sandboxed process per slot; grader failures are errors, not rewards of 0."""
from __future__ import annotations

import json

import pytest

from gymloop.envs import make_env

SOURCE = ("def grade(sample, item):\n"
          "    if item['answer'] == 'boom':\n"
          "        raise ValueError('no answer')\n"
          "    if item['answer'] == 'exit':\n"
          "        import os; os._exit(3)\n"
          "    return float(sample['output_text'].strip() == item['answer'])\n")


def env_of(tmp_path, answers, grader=None, **kw):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], "answer": a}) + "\n"
                            for i, a in enumerate(answers)))
    return make_env("graded", path=str(path), grader=grader or {"type": "python", "source": SOURCE}, **kw)


def episodes(env, replies):
    tasks = env.tasks("train")
    return [(t, list(t.prompt) + [{"role": "assistant", "content": r}]) for t, r in zip(tasks, replies)]


def test_python_graders_grade_a_batch_with_errors_where_the_grader_failed(tmp_path):
    env = env_of(tmp_path, ["1", "2", "boom", "4", "5"])
    try:
        scores = env.verify_batch(episodes(env, ["1", "x", "1", "4", "5"]))
        assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 1.0, 1.0]
        assert [s.error is not None for s in scores] == [False, False, True, False, False]
        assert "ValueError: no answer" in scores[2].error
        # one reply at a time gives the same verdicts
        assert [env.verify(t, m).reward for t, m in episodes(env, ["1", "x", "1", "4", "5"])] == [1.0, 0.0, 0.0, 1.0, 1.0]
    finally:
        env.close()


def test_a_grader_that_kills_its_process_makes_the_rest_of_the_batch_errors(tmp_path):
    env = env_of(tmp_path, ["1", "exit", "3", "4"], sandbox_slots=1)
    try:
        scores = env.verify_batch(episodes(env, ["1", "x", "3", "4"]))
        assert scores[0].reward == 1.0 and scores[0].error is None
        assert all(s.error is not None for s in scores[1:])       # never scored 0 as if the model failed
    finally:
        env.close()


def test_other_graders_and_bad_files(tmp_path):
    env = env_of(tmp_path, ["a", "b"], grader={"type": "string_check", "input": "{{sample.output_text}}",
                                               "reference": "{{item.answer}}", "operation": "eq"})
    assert [s.reward for s in env.verify_batch(episodes(env, ["a", "a"]))] == [1.0, 0.0]
    assert env.heldout_is_train and len(env.sample_tasks(2, "heldout", 0)) == 2
    with pytest.raises(ValueError, match="does not parse"):
        env_of(tmp_path, ["a"], grader={"type": "python", "source": "def grade(:"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"messages": [{"role": "assistant", '
                   '"content": "x"}]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: the last message"):
        make_env("graded", path=str(bad), grader={"type": "python", "source": SOURCE})


def test_the_cli_says_why_a_graded_environment_cannot_be_validated_and_never_shows_pydantic_links(tmp_path, capsys):
    from gymloop.cli import main

    rows = tmp_path / "g.jsonl"
    rows.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1="}], "answer": "2"}) + "\n")
    grader = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
              "operation": "eq"}
    assert main(["envs", "validate", "graded", "--n", "1", "--options",
                 json.dumps({"path": str(rows), "grader": grader})]) == 2
    err = capsys.readouterr().err
    assert "has no gold replies" in err and "Traceback" not in err
    assert main(["envs", "validate", "arith", "--options", '{"digits": "x"}']) == 2
    err = capsys.readouterr().err
    assert err.strip() == "gymloop envs: error: digits: Input should be a valid integer, unable to parse string " \
                          "as an integer (got 'x')"


@pytest.mark.parametrize("bounds, reply, reward", [([0, 10], "7", 0.7), ([10, 0], "7", 0.3), (None, "0.25", 0.25)])
def test_score_model_range_maps_its_first_bound_to_0_and_its_second_to_1(bounds, reply, reward):
    from gymloop.envs.graders import Runtime, grade, parse

    g = parse({"type": "score_model", "name": "judge", "model": "m", "input": [{"role": "user", "content": "rate"}],
               **({"range": bounds} if bounds else {})})
    assert grade(g, {}, {}, Runtime(chat=lambda model, msgs, params: reply)).reward == pytest.approx(reward)


def test_a_score_model_range_of_equal_bounds_is_refused_by_its_schema():
    from jsonschema import Draft202012Validator

    from gymloop.envs.grader_types import ScoreModelGrader
    from gymloop.envs.graders import GraderError, parse

    body = {"type": "score_model", "name": "s", "model": "m", "input": [{"role": "user", "content": "x"}], "range": [0, 0]}
    assert list(Draft202012Validator(ScoreModelGrader.model_json_schema()).iter_errors(body))   # documented
    with pytest.raises((GraderError, ValueError), match="two different"):
        parse(body)
