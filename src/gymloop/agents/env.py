"""The `agent` environment: a team's agent program, unchanged, is the environment.

    env:
      name: agent
      options:
        harness: my_agent:run        # function(task, client, model) -> reward | {reward, components}
        path: agents/                # put on the import path first (optional)
        # or command: [python, my_agent.py]   (any program: OPENAI_BASE_URL, OPENAI_API_KEY,
        #                                      GYMLOOP_MODEL, GYMLOOP_TASK; last stdout line {"reward": x})
        tasks: agents/tasks.jsonl    # one task a line: id, split (train | heldout), anything else
        timeout_s: 120
        concurrency: 8

Each episode runs the program once against an OpenAI endpoint on the run's engine (gateway.py)
with a key of its own; the program calls the model as it likes and returns its reward. Its calls'
exact ids are merged into training sequences (capture.py); a program that fails is an error,
never a reward (programs.py). GRPO runs the program `group_size` times per task, `concurrency`
at once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..envs.base import Message, PeerEnvironment, Score, Split, Task, json_lines
from ..rollout.capture import merge
from .programs import AsyncRunner, Outcome, ProgramError, Runner, command_runner, function_runner, load_function


log = logging.getLogger("gymloop.agents")


class AgentConfig(BaseModel):
    """The `agent` environment's options."""

    model_config = ConfigDict(extra="forbid")

    harness: str | None = Field(None, description="The program as a Python function, 'module:function': "
                                "function(task: dict, client, model: str) -> float | {reward, components}; sync "
                                "gets an openai.OpenAI, async def an openai.AsyncOpenAI.")
    command: list[str] | None = Field(None, description="The program as a command (argv), any language or venv: "
                                      "OPENAI_BASE_URL, OPENAI_API_KEY, GYMLOOP_MODEL and GYMLOOP_TASK (the task "
                                      "as JSON) are set; its last stdout line is {\"reward\": x, ...}.")
    path: str | None = Field(None, description="harness: a directory put first on the import path.")
    cwd: str | None = Field(None, description="command: the directory it runs in (default: the current one).")
    env: dict[str, str] = Field(default_factory=dict, description="command: more environment variables.")
    tasks: str = Field(description="JSONL file, one task a line: 'id', 'split' (train | heldout, default train), "
                       "every other field passed to the program as is.")
    timeout_s: float = Field(120.0, gt=0, description="Most seconds one episode may run (past it: an error).")
    concurrency: int = Field(32, ge=1, description="Episodes (programs) running at once; their model calls share "
                             "engine batches.")
    batch_wait_ms: float = Field(20.0, ge=0, description="How long the endpoint waits for more episodes' calls to "
                                 "fill an engine batch (longer: bigger batches; shorter: less latency per call).")
    model_name: str = Field("policy", description="The model id the program is given (any other gets 404).")

    @model_validator(mode="after")
    def _one_program(self) -> "AgentConfig":
        if (self.harness is None) == (self.command is None):
            raise ValueError("agent needs exactly one of harness: module:function or command: [argv...]")
        if self.command is not None and (not self.command or not all(self.command)):
            raise ValueError("agent command must be a non-empty list of strings (argv)")
        return self


def load_agent_tasks(path: str, env: str) -> list[Task]:
    """The tasks of a task file (a bad line names its number)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"agent tasks file {path} does not exist")
    tasks: dict[str, Task] = {}
    for n, row in json_lines(file):
        if not isinstance(row, dict) or "id" not in row:
            raise ValueError(f"{path}:{n}: a task is a JSON object with an 'id'")
        split = row.get("split", "train")
        if split not in ("train", "heldout"):
            raise ValueError(f"{path}:{n}: split must be train or heldout, not {split!r}")
        tid = str(row["id"])
        if tid in tasks:
            raise ValueError(f"{path}:{n}: task id {tid!r} appears twice")
        # what the program sees is the row as written; the prompt is what a person would read of it
        first = row.get("input", row.get("question", row.get("prompt")))
        text = first if isinstance(first, str) else json.dumps(row)
        tasks[tid] = Task(id=tid, env=env, prompt=({"role": "user", "content": text},), answer=None,
                          split=split, source="dataset", info=dict(row))
    if not tasks:
        raise ValueError(f"agent tasks file {path} holds no tasks")
    return list(tasks.values())


class AgentEnvironment(PeerEnvironment):
    """A user's agent program as the environment (see the module docstring). Picklable as its
    options (a Ray rollout worker builds its own, with its own endpoint)."""

    runs_episodes = True

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.name = "agent"
        self._tasks = load_agent_tasks(config.tasks, self.name)
        self._by_id = {t.id: t for t in self._tasks}
        self._runner: Runner | AsyncRunner | None = None
        self._gateway = None
        self._gateway_engine = None

    # -- tasks ---------------------------------------------------------------------------------
    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        """`n` tasks of `split`; a train split smaller than `n` is drawn whole and again (groups of
        the same task in one step), a held-out one must hold `n`."""
        pool = [t for t in self._tasks if t.split == split]
        if not pool:
            raise ValueError(f"{self.config.tasks} has no {split} tasks")
        rng = random.Random(f"agent|{split}|{seed}")
        if n <= len(pool):
            return rng.sample(pool, n)
        if split == "heldout":
            raise ValueError(f"asked for {n} held-out tasks; {self.config.tasks} has {len(pool)}")
        out: list[Task] = []
        while len(out) < n:
            out += rng.sample(pool, min(len(pool), n - len(out)))
        return out

    def all_tasks(self) -> list[Task]:
        return list(self._tasks)

    def task_from_id(self, task_id: str) -> Task:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise ValueError(f"no task {task_id!r} in {self.config.tasks}") from None

    def task_from_session(self, session: dict) -> Task:
        """A production session's task as the program named it (every field passed to the program
        as is), or its first user input; trained on like a train task."""
        row = dict(session.get("task") or {})
        row.setdefault("id", session["id"])
        text = row.get("input", row.get("question", row.get("prompt")))
        return Task(id=f"session:{session['id']}", env=self.name,
                    prompt=({"role": "user", "content": text if isinstance(text, str) else json.dumps(row)},),
                    answer=None, split="train", source="production", info=row)

    def verify(self, task: Task, messages: list[Message]) -> Score:
        raise NotImplementedError("an agent program scores its own episodes: its return value is the reward")

    # -- episodes ------------------------------------------------------------------------------
    def runner(self) -> Runner | AsyncRunner:
        if self._runner is None:
            c = self.config
            self._runner = (function_runner(load_function(c.harness, c.path)) if c.harness is not None
                            else command_runner(c.command or [], cwd=c.cwd, env=c.env))
        return self._runner

    def gateway(self, engine, tok, context: int):
        """The endpoint on `engine` (started on first use; a new engine gets a new one)."""
        from .gateway import Gateway

        if self._gateway is not None and self._gateway_engine is not engine:
            self._gateway.close()
            self._gateway = None
        if self._gateway is None:
            self._gateway = Gateway(engine, tok, self.config.model_name, context=context - 1,
                                    max_batch=max(64, self.config.concurrency), max_wait_ms=self.config.batch_wait_ms)
            self._gateway_engine = engine
        return self._gateway

    def run_episodes(self, engine, tok, tasks: list[Task], n_per_task: int, params, max_total_tokens: int):
        """Every task's program run `n_per_task` times (a group, adjacent), `concurrency` at once;
        (rollouts, stats) as `rollout.collect` returns them."""
        from ..rollout.episodes import RolloutStats

        runner = self.runner()
        limit = min(max_total_tokens, getattr(engine, "context", None) or max_total_tokens)
        gw = self.gateway(engine, tok, limit)
        eos = tuple(sorted(set(params.stop_token_ids) | set(tok.eos_token_ids)))
        gw.capture.params = dataclasses.replace(params, stop_token_ids=eos)
        gw.take_usage()
        overridden = gw.capture.overridden
        t0 = time.perf_counter()
        jobs = [t for t in tasks for _ in range(n_per_task)]
        if inspect.iscoroutinefunction(runner):
            # one event loop (in a thread of its own: the caller may be inside one) runs every episode
            with ThreadPoolExecutor(1, thread_name_prefix="agent-episodes") as pool:
                rollouts = pool.submit(asyncio.run, self._async_episodes(gw, runner, tok, jobs, engine)).result()
        else:
            with httpx.Client(timeout=self.config.timeout_s) as http, \
                    ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="agent-episode") as pool:
                rollouts = list(pool.map(lambda t: self._episode(gw, runner, tok, t, engine, http), jobs))
        used = gw.take_usage()
        stats = RolloutStats(episodes=len(rollouts), generated_tokens=used.generated_tokens,
                             prompt_tokens=used.prompt_tokens, gen_seconds=used.seconds,
                             env_seconds=max(0.0, time.perf_counter() - t0 - used.seconds),
                             errors=sum(not r.ok for r in rollouts), calls=sum(r.calls for r in rollouts),
                             segments=sum(1 + len(r.segments) for r in rollouts if r.calls),
                             overridden=gw.capture.overridden - overridden)
        if stats.overridden and not overridden:
            log.warning("the agent program asks for its own sampling (temperature, top_p or max_tokens); its calls "
                        "sample as the run does (sampling.*), so the behaviour log-probs are the policy's")
        return rollouts, stats

    async def _async_episodes(self, gw, runner: AsyncRunner, tok, jobs: list[Task], engine) -> list:
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(task: Task, http: httpx.AsyncClient):
            async with gate:
                key = gw.capture.open()
                try:
                    return self._rollout(gw, tok, task, engine, key, await runner(
                        dict(task.info), gw.base_url, key, self.config.model_name, self.config.timeout_s, http))
                except ProgramError as exc:
                    return self._rollout(gw, tok, task, engine, key, exc)

        limits = httpx.Limits(max_connections=self.config.concurrency, max_keepalive_connections=self.config.concurrency)
        async with httpx.AsyncClient(timeout=self.config.timeout_s, limits=limits) as http:
            return list(await asyncio.gather(*(one(t, http) for t in jobs)))

    def _episode(self, gw, runner: Runner, tok, task: Task, engine, http: httpx.Client):
        key = gw.capture.open()
        try:
            result = runner(dict(task.info), gw.base_url, key, self.config.model_name, self.config.timeout_s, http)
        except ProgramError as exc:
            return self._rollout(gw, tok, task, engine, key, exc)
        return self._rollout(gw, tok, task, engine, key, result)

    def _rollout(self, gw, tok, task: Task, engine, key: str, result: Outcome | ProgramError):
        """The episode as a Rollout: its key closed, its calls merged into segments, the program's
        outcome as its score (a failure as an error)."""
        from ..rollout.episodes import Rollout

        calls = gw.capture.close(key)
        error = str(result) if isinstance(result, ProgramError) else None
        if error is None and not calls:
            error = f"task {task.id}: the program made no model call (nothing to train on)"
        segments = merge(calls, tok)
        first = segments[0] if segments else None
        r = Rollout(task=task, prompt_ids=first.prompt_ids if first else [], token_ids=first.token_ids if first else [],
                    mask=first.mask if first else [], logprobs=first.logprobs if first else [],
                    messages=list(segments[-1].messages) if segments else [dict(m) for m in task.prompt],
                    version=min((c.version for c in calls), default=engine.version), turns=len(calls),
                    calls=len(calls), segments=segments[1:])
        if error is not None or not isinstance(result, Outcome):
            r.score = Score(0.0, {}, "the program failed", error=error or "no result")
        else:
            r.score = Score(result.reward, {"reward": result.reward, **result.components},
                            f"the program returned {result.reward:g} after {len(calls)} model call(s)")
        return r

    def __reduce__(self):
        return _rebuild, (self.options,)

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
            self._gateway = None


def make_agent(**options) -> AgentEnvironment:
    env = AgentEnvironment(AgentConfig(**options))
    env.options = dict(options)
    return env


def _rebuild(options: dict) -> AgentEnvironment:
    """A copy in another process (a Ray rollout worker): built from the options, its own endpoint."""
    return make_agent(**options)
