"""Rollouts: episodes as token ids, batched through the engine across many tasks.

The model's turns keep the exact ids the engine sampled (with their behaviour log-probs);
environment observations are appended as tokens rendered by the chat template and masked
out of the loss. Text is never re-tokenized for training.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np

from ..models.chat import ChatTokenizer
from ..engine import Engine, SamplingParams
from ..envs.base import Environment, Message, Score, Task




@dataclass
class Segment:
    """One token sequence of an agent program's episode (rollout/capture.py merges its calls into
    them): prompt_ids, then token_ids with mask (1 on sampled tokens) and logprobs (behaviour
    log-probs on sampled tokens, 0 elsewhere) aligned with it."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    calls: int = 0
    messages: list[dict] = field(default_factory=list)     # the conversation so far, the last reply included
    tools: list[dict] | None = None
    ended: bool = True                                      # the last sample ended its turn


@dataclass
class Rollout:
    """One finished episode.

    prompt_ids: the first prompt; token_ids: everything after it (model turns and
    observations); mask / logprobs are aligned with token_ids (1 / behaviour log-prob on
    model-produced tokens, 0 on observation tokens).
    """

    task: Task
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    score: Score | None = None
    version: int = 0
    turns: int = 0
    truncated: bool = False
    # MoE router replay: the experts of prompt_ids + token_ids[:-1], [layers, L - 1, k], as a numpy
    # array: rollouts cross process boundaries (the collector process) by value, not shared memory
    routing: "np.ndarray | None" = None
    # an agent program's episode: its model calls, and the further token sequences it left (calls
    # that continued no earlier one: rollout/capture.py), trained with the episode's advantage
    calls: int = 0
    segments: list[Segment] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return self.score.reward if self.score else 0.0

    @property
    def ok(self) -> bool:
        """False when the infrastructure failed: such rollouts are excluded from training."""
        return self.score is not None and self.score.error is None

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask) + sum(sum(s.mask) for s in self.segments)

    def sequences(self) -> list["Rollout"]:
        """The episode's training rows: itself, then one per further segment (the same task,
        score and version)."""
        return [self] + [Rollout(task=self.task, prompt_ids=s.prompt_ids, token_ids=s.token_ids, mask=s.mask,
                                 logprobs=s.logprobs, score=self.score, version=self.version)
                         for s in self.segments]


@dataclass
class RolloutStats:
    episodes: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    gen_seconds: float = 0.0
    env_seconds: float = 0.0
    errors: int = 0
    calls: int = 0                 # agent programs' model calls
    segments: int = 0              # ... and the training sequences they made
    overridden: int = 0            # ... and those whose own sampling the run's replaced

    def add(self, other: "RolloutStats") -> None:
        """Accumulate another batch run after this one (counts and seconds both add)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def collect(engine: Engine, tok: ChatTokenizer, env: Environment, tasks: Sequence[Task],
            n_per_task: int, params: SamplingParams, max_turns: int = 1,
            max_total_tokens: int = 2048) -> tuple[list[Rollout], RolloutStats]:
    """Run `n_per_task` episodes of every task; members of a task's group are adjacent.

    Every live episode's next turn is generated in one engine batch, so multi-turn episodes
    share the engine as single-turn ones do.
    """
    if env.runs_episodes:      # an agent program drives its own episodes through an endpoint on `engine`
        return env.run_episodes(engine, tok, tasks, n_per_task, params, max_total_tokens)
    stats = RolloutStats()
    eos = tuple(sorted(set(params.stop_token_ids) | set(tok.eos_token_ids)))
    params = SamplingParams(**{**params.__dict__, "stop_token_ids": eos})
    rollouts = []
    for task in tasks:
        tools = env.tools(task)
        for _ in range(n_per_task):
            # each episode its own reset: an environment with state on its side (a session of a peer's
            # server) keeps one per episode, and the group's prompts are equal all the same
            msgs = env.reset(task)
            rollouts.append(Rollout(task=task, prompt_ids=tok.prompt_ids(msgs, tools=tools), messages=[dict(m) for m in msgs],
                                    version=engine.version))
    # an episode never grows past the model's context: one that has no room left for a token is
    # truncated, and a turn generates at most what the fullest episode of the batch has room for
    limit = min(max_total_tokens, getattr(engine, "context", None) or max_total_tokens)   # a scripted policy may not say
    unread = {id(r) for r in rollouts if len(r.prompt_ids) >= limit}
    for r in rollouts:
        r.truncated = id(r) in unread
    live = [r for r in rollouts if not r.truncated]
    for turn in range(max_turns):
        if not live:
            break
        prompts = [r.prompt_ids + r.token_ids for r in live]
        room = limit - max(map(len, prompts))
        turn_params = params if room >= params.max_new_tokens else \
            SamplingParams(**{**params.__dict__, "max_new_tokens": room})
        batch = engine.generate(prompts, turn_params)
        stats.gen_seconds += batch.seconds
        stats.generated_tokens += batch.generated_tokens
        stats.prompt_tokens += batch.prompt_tokens
        t0 = time.perf_counter()
        still = []
        for r, g in zip(live, batch.generations):
            r.token_ids += g.token_ids
            r.mask += [1] * len(g.token_ids)
            r.logprobs += g.logprobs
            r.turns += 1
            # this turn's prompt was the whole episode so far: its routing covers every position
            r.routing = None if g.routing is None else g.routing.numpy().astype(np.int16)
            text = tok.decode(g.token_ids)
            r.messages.append({"role": "assistant", "content": text})
            if g.finish_reason == "length":
                r.truncated = True
                continue
            step = env.step(r.task, r.messages, text)
            if step.done or turn == max_turns - 1:
                continue
            obs = tok.continuation_ids(r.messages, step.observation, tools=env.tools(r.task))
            if len(r.prompt_ids) + len(r.token_ids) + len(obs) >= limit:
                r.truncated = True
                continue
            r.messages += [dict(m) for m in step.observation]
            r.token_ids += obs
            r.mask += [0] * len(obs)
            r.logprobs += [0.0] * len(obs)
            still.append(r)
        stats.env_seconds += time.perf_counter() - t0
        live = still
    t0 = time.perf_counter()
    for r, score in zip(rollouts, _verify(env, rollouts)):
        # a prompt the model cannot even read says nothing about the model: excluded, as an error
        r.score = score if id(r) not in unread else Score(0.0, {}, "not run", error=(
            f"the prompt ({len(r.prompt_ids)} tokens) does not fit the model's context ({limit} positions)"))
        stats.errors += 0 if r.ok else 1
    stats.env_seconds += time.perf_counter() - t0
    stats.episodes = len(rollouts)
    return rollouts, stats


def _verify(env: Environment, rollouts: list[Rollout]) -> list[Score]:
    """Scores of all episodes (batched, so code environments use their sandbox pool).

    A verifier that raises is a harness failure, recorded as an error, never as reward 0.
    """
    try:
        return env.verify_batch([(r.task, r.messages) for r in rollouts])
    except Exception:  # noqa: BLE001 - fall back to one at a time to find the failing ones
        pass
    out = []
    for r in rollouts:
        try:
            out.append(env.verify(r.task, r.messages))
        except Exception as exc:  # noqa: BLE001 - any verifier bug must be contained and reported
            out.append(Score(0.0, {}, "verifier raised", error=f"{type(exc).__name__}: {exc}"))
    return out
