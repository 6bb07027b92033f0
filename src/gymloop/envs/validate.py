"""`gymloop envs validate`: gold episodes must score 1.0 and known-wrong ones less."""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import Environment, play


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


def validate(env: Environment, n: int = 20, seed: int = 0) -> Validation:
    split = "heldout" if env.name == "humaneval" else "train"
    tasks = env.sample_tasks(n, split, seed)
    v = Validation(env=env.name, tasks=len(tasks))
    gold, wrong = [], []
    for t in tasks:
        msgs, score = play(env, t, env.gold_turns(t))
        gold.append((t, msgs, score))
        turns = env.wrong_turns(t)
        if turns is not None:
            wrong.append((t, play(env, t, turns)))
    for t, _, s in gold:
        if s.error:
            v.errors.append(f"{t.id}: infrastructure error on the gold episode: {s.error}")
        elif s.reward == 1.0:
            v.gold_passed += 1
        else:
            v.errors.append(f"{t.id}: gold episode scored {s.reward}: {s.reason}")
    for t, (_, s) in wrong:
        v.wrong_checked += 1
        if s.reward < 1.0 and not s.error:
            v.wrong_rejected += 1
        else:
            v.errors.append(f"{t.id}: known-wrong episode scored {s.reward} ({s.error or s.reason})")
    return v
