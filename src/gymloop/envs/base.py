"""The environment protocol: tasks in, messages out, a verifier that scores an episode.

An environment is stateless across tasks: the episode's state is its message list, so an
environment can be placed in another process or worker and called with plain data.
"""
from __future__ import annotations

import functools
import hashlib
import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

Message = dict  # {"role": "system"|"user"|"assistant"|"tool", "content": str}
Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class Task:
    """One problem an environment can score.

    `answer` and `info` hold what the verifier needs; `source` says where the task came from.
    """

    id: str
    env: str
    prompt: tuple[Message, ...]
    answer: Any
    split: Split = "train"
    source: Literal["synthetic", "dataset", "production"] = "synthetic"
    info: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Score:
    """A verifier's verdict on a finished episode.

    `error` is set when the *infrastructure* failed (sandbox crash, harness bug): such an
    episode carries no information about the model and is excluded from training, never
    silently scored 0.
    """

    reward: float
    components: dict[str, float]
    reason: str
    error: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {self.reward}")


def json_lines(path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSON-lines file; a line that is not JSON
    is a ValueError naming the file and the line."""
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None


def check_reward_range(option, env: str) -> tuple[float, float]:
    """A peer environment's `reward_range` option checked: [low, high] of its own reward scale."""
    try:
        lo, hi = (float(x) for x in option)
    except (TypeError, ValueError):
        raise ValueError(f"{env} option reward_range must be [low, high], not {option!r}") from None
    if not hi > lo:
        raise ValueError(f"{env} option reward_range must be [low, high] with high > low, not {option!r}")
    return lo, hi


def unit_reward(value: float, scale: tuple[float, float]) -> float:
    """A reward on a peer's scale [low, high] mapped linearly onto gymloop's [0, 1], clipped."""
    lo, hi = scale
    return min(1.0, max(0.0, (value - lo) / (hi - lo)))


@dataclass(frozen=True)
class StepResult:
    observation: tuple[Message, ...]
    done: bool


def split_of(key: str, heldout_fraction: float) -> Split:
    """Deterministic train/held-out assignment from a task's canonical key.

    Hashing the problem itself (not a sample index) guarantees the two splits never share a
    problem, however many tasks are drawn from either.
    """
    bucket = int.from_bytes(hashlib.sha1(key.encode()).digest()[:4], "big") / 2**32
    return "heldout" if bucket < heldout_fraction else "train"


def sample_distinct(draw: Callable[[random.Random, Split], Task], n: int, split: Split,
                    rng: random.Random, space_size: int, heldout_fraction: float) -> list[Task]:
    """`n` distinct tasks of `split` from a generator `draw(rng, split)`.

    Refuses up front when the split holds too few problems (rejection sampling would spin).
    """
    frac = heldout_fraction if split == "heldout" else 1 - heldout_fraction
    available = int(space_size * frac)
    if n > available * 0.9:
        raise ValueError(f"asked for {n} distinct {split} tasks; only ~{available} exist")
    seen: dict[str, Task] = {}
    while len(seen) < n:
        task = draw(rng, split)
        seen.setdefault(task.id, task)
    return list(seen.values())


class Environment(ABC):
    """Multi-turn text environment with its own verifier."""

    name: str
    # True for an environment whose episodes a program drives (an agent program calling the model
    # through an endpoint): `rollout.collect` hands it the engine (run_episodes) instead of
    # generating each turn itself.
    runs_episodes: bool = False

    @abstractmethod
    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        """`n` distinct tasks of `split`, reproducible from `seed`."""

    def task_from_id(self, task_id: str) -> Task:
        """Rebuild a task from its id (how production feedback names a task to retrain on)."""
        raise ValueError(f"environment {self.name!r} cannot rebuild tasks from ids")

    def task_from_session(self, session: dict) -> Task:
        """A task from a production session of an agent program (its `id` and the `task` it named):
        how session feedback becomes training."""
        raise ValueError(f"environment {self.name!r} cannot rebuild tasks from sessions")

    def tools(self, task: Task) -> list[dict] | None:
        """Tool schemas (OpenAI function format) the chat template renders into the prompt."""
        return None

    def reset(self, task: Task) -> list[Message]:
        """The messages the model sees first."""
        return [dict(m) for m in task.prompt]

    def step(self, task: Task, messages: list[Message], assistant_text: str) -> StepResult:
        """React to the model's turn. Single-turn environments are done after one reply."""
        return StepResult(observation=(), done=True)

    @abstractmethod
    def verify(self, task: Task, messages: list[Message]) -> Score:
        """Score a finished episode (its full message list, ending with the model's reply)."""

    def verify_batch(self, items: list[tuple[Task, list[Message]]]) -> list[Score]:
        """Score many episodes; environments that run code override this to use a pool."""
        return [self.verify(t, m) for t, m in items]

    def all_tasks(self) -> list[Task] | None:
        """Every task, when the environment holds a finite set (a task file); None otherwise."""
        return None

    def gold_reply(self, task: Task) -> str:
        """A reply that must score 1.0 (single-turn environments)."""
        raise NotImplementedError

    def gold_turns(self, task: Task) -> list[str]:
        """The model turns of an episode that must score 1.0 (used by `validate`)."""
        return [self.gold_reply(task)]

    def wrong_turns(self, task: Task) -> list[str] | None:
        """Turns of a known-wrong episode, which must score below 1.0 (None: no such check)."""
        return None

    def run_episodes(self, engine, tok, tasks: list[Task], n_per_task: int, params, max_total_tokens: int):
        """(rollouts, stats) of `n_per_task` episodes of every task, members of a group adjacent,
        for an environment that `runs_episodes`."""
        raise NotImplementedError(f"environment {self.name!r} does not run its own episodes")

    def close(self) -> None:  # noqa: B027 - a hook with nothing to release by default, not abstract
        """Release what the environment holds (a peer's process, a sandbox pool, an endpoint)."""


class PeerEnvironment(Environment):
    """An environment whose peer code runs in a process of its own (a bridge, a server), which
    cannot be copied: it is pickled (to a Ray rollout worker, a collector process) as its options,
    and the copy starts its own process."""

    options: dict = {}

    def __reduce__(self):
        return peer(type(self)), (self.options,)


def peer(cls: type[PeerEnvironment]) -> Callable[[dict], PeerEnvironment]:
    """The factory of a peer environment class: built from its options, which it keeps."""
    return functools.partial(_build_peer, cls)


def _build_peer(cls: type[PeerEnvironment], options: dict) -> PeerEnvironment:
    env = cls(**options)
    env.options = dict(options)
    return env


def run_episode(env: Environment, task: Task, reply: Callable[[list[Message]], str],
                max_turns: int) -> tuple[list[Message], Score]:
    """One episode through the environment protocol, whoever writes the model's turns: `reply`
    gets the conversation so far and returns the next assistant message (a script, a client of
    the serving API). Ends when the environment says done or after `max_turns` replies, then
    verifies. (Training's `rollout.episodes.collect` runs the same turns batched, on token ids.)"""
    messages = env.reset(task)
    for turn in range(max_turns):
        text = reply(messages)
        messages.append({"role": "assistant", "content": text})
        step = env.step(task, messages, text)
        if step.done or turn == max_turns - 1:
            break
        messages += [dict(m) for m in step.observation]
    return messages, env.verify(task, messages)


def play_turns(env: Environment, task: Task, turns: list[str]) -> list[Message]:
    """Scripted model turns through the environment protocol, not verified: the episode's messages."""
    messages = env.reset(task)
    for i, text in enumerate(turns):
        messages.append({"role": "assistant", "content": text})
        step = env.step(task, messages, text)
        if step.done or i == len(turns) - 1:
            break
        messages += [dict(m) for m in step.observation]
    return messages


def play(env: Environment, task: Task, turns: list[str]) -> tuple[list[Message], Score]:
    """Run scripted model turns through the environment protocol and verify the episode."""
    messages = play_turns(env, task, turns)
    return messages, env.verify(task, messages)
