"""Arithmetic environment: generation, splits, verifier."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from gymloop.envs import ArithConfig, ArithEnv, make_env
from gymloop.envs.arith import LEVELS, evaluate, parse_answer


def test_evaluate_respects_precedence():
    assert evaluate("2+3*4") == 14
    assert evaluate("10-2-3") == 5
    assert evaluate("7*6-2*3+1") == 37


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_splits_never_overlap_and_are_seeded(level):
    env = ArithEnv(LEVELS[level])
    n = min(200, int(env.space_size() * 0.05))
    train = env.sample_tasks(n, "train", seed=1)
    held = env.sample_tasks(n // 4, "heldout", seed=1)
    assert not {t.id for t in train} & {t.id for t in held}
    assert len({t.id for t in train}) == n
    assert [t.id for t in env.sample_tasks(n, "train", seed=1)] == [t.id for t in train]
    assert [t.id for t in env.sample_tasks(n, "train", seed=2)] != [t.id for t in train]
    assert all(t.split == "train" for t in train) and all(t.split == "heldout" for t in held)
    for t in train[:20]:
        expr = t.prompt[0]["content"].rstrip("=")
        import re
        assert t.answer == evaluate(expr)
        assert max(len(x) for x in re.findall(r"\d+", expr)) <= LEVELS[level].digits


def test_too_many_tasks_is_an_error():
    with pytest.raises(ValueError, match="distinct heldout"):
        ArithEnv(ArithConfig(digits=1, ops="+")).sample_tasks(50, "heldout", 0)


def test_verifier_components():
    env = ArithEnv()
    task = env.make_task("17+25")
    score = lambda text: env.verify(task, [*task.prompt, {"role": "assistant", "content": text}])  # noqa: E731
    s = score("42")
    assert (s.reward, s.components) == (1.0, {"format": 1.0, "correct": 1.0})
    s = score("The answer is 42.")
    assert s.reward == 1.0 and s.components["format"] == 0.0
    s = score("41")
    assert s.reward == 0.0 and "expected 42, got 41" in s.reason
    s = score("no idea")
    assert s.reward == 0.0 and s.reason == "no integer in the reply"
    assert env.verify(task, list(task.prompt)).reward == 0.0
    assert parse_answer("-7") == -7
    assert env.verify(task, [*task.prompt, {"role": "assistant", "content": env.gold_reply(task)}]).reward == 1.0


def test_bad_options_are_clear_errors():
    with pytest.raises(ValidationError, match="ops"):
        make_env("arith", ops="/")
    with pytest.raises(ValidationError, match="digits"):
        make_env("arith", digits=0)
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        make_env("nope")
