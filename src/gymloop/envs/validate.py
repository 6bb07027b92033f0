"""`gymloop envs validate`: gold episodes must score 1.0 and known-wrong ones less."""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import Environment, play_turns


@dataclass
class Validation:
    env: str
    tasks: int = 0
    gold_passed: int = 0
    wrong_checked: int = 0
    wrong_rejected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (not self.errors and self.gold_passed == self.tasks
                and self.wrong_rejected == self.wrong_checked)


class CannotValidate(ValueError):
    """The environment offers nothing to validate by (no gold replies); the message says why."""


def validate(env: Environment, n: int = 20, seed: int = 0) -> Validation:
    """`n` tasks (n <= 0: every task of an environment that holds a finite set), each played with
    its gold turns and its known-wrong turns; all episodes scored in one verify_batch (environments
    that run code verify them in parallel)."""
    split = "heldout" if env.name == "humaneval" else "train"
    tasks = env.all_tasks() if n <= 0 else None
    if tasks is None:
        tasks = env.sample_tasks(n if n > 0 else 20, split, seed)
    v = Validation(env=env.name, tasks=len(tasks))
    try:
        gold = [(t, play_turns(env, t, env.gold_turns(t))) for t in tasks]
    except NotImplementedError:
        raise CannotValidate(
            f"environment {env.name!r} has no gold replies (gold_reply / gold_turns), so gold episodes cannot "
            "check its verifier; its tasks loaded. A graded environment's grader is checked when it is built "
            "(and by POST /v1/fine_tuning/alpha/graders/validate); another environment validates once it "
            "implements gold_reply (docs/environments.md)") from None
    wrong = [(t, play_turns(env, t, turns)) for t in tasks if (turns := env.wrong_turns(t)) is not None]
    scores = env.verify_batch(gold + wrong)
    for (t, _), s in zip(gold, scores[:len(gold)]):
        if s.error:
            v.errors.append(f"{t.id}: infrastructure error on the gold episode: {s.error}")
        elif s.reward == 1.0:
            v.gold_passed += 1
        else:
            v.errors.append(f"{t.id}: gold episode scored {s.reward}: {s.reason}")
    for (t, _), s in zip(wrong, scores[len(gold):]):
        v.wrong_checked += 1
        if s.reward < 1.0 and not s.error:
            v.wrong_rejected += 1
        else:
            v.errors.append(f"{t.id}: known-wrong episode scored {s.reward} ({s.error or s.reason})")
    return v
