"""`swe`: fix a real bug in a real repository with a coding agent's tools; the project's own tests,
run by the harness in the sandbox, decide.

    env: {name: swe, options: {tasks: tasks.jsonl, repos: DIR}}

`tasks` is any SWE-bench-format JSON-lines file (default: the tasks `gymloop swe build` made);
each instance's `repo` is a git directory under `repos` (or an absolute path) holding
`base_commit`. An episode: the problem statement, then turns of tool calls
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, schemas in the request's `tools`)
answered by `<tool_response>` messages, until `submit()` or a reply without a call. The final
diff of the episode's edits is verified by swe/harness.py: reward 1 when every FAIL_TO_PASS and
PASS_TO_PASS test passes, with the pass fractions as components.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import random
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..envs.base import Environment, Message, Score, Split, StepResult, Task
from ..models.toolcalls import format_call, parse_tool_calls, tool_response
from ..sandbox import Limits, Pool
from .harness import Harness, Verdict, base_tree
from .instance import Instance, load_instances
from .tools import SCHEMAS, Workspace, call_tool

SYSTEM = ("You are a software engineer fixing a bug in a Python repository. Use the tools to read the code, "
          "edit it and run tests. Call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>. "
          "Call submit() when the failing tests pass.")


COMPACT_SYSTEM = ("Fix the bug. Tools: " + ", ".join(
    f"{s['function']['name']}({', '.join(s['function']['parameters']['properties'])})" for s in SCHEMAS)
    + ' as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')


def compact_statement(statement: str) -> str:
    """The statement's first line (which test fails) and the first error line of its traceback (the
    exception and its message)."""
    lines = statement.splitlines()
    errors = [ln for ln in lines if ln.startswith("E ")]
    return "\n".join([lines[0]] + errors[:1]) if lines else statement


def default_cache() -> Path:
    return Path(os.environ.get("GYMLOOP_CACHE", Path.home() / ".cache" / "gymloop")) / "swe"


class SweConfig(BaseModel):
    """The swe environment."""

    model_config = ConfigDict(extra="forbid")
    tasks: str | None = Field(None, description="SWE-bench-format JSON-lines file (default: the built tasks "
                              "in the cache, `gymloop swe build`).")
    repos: str | None = Field(None, description="Directory holding the instances' repositories (default: the cache's).")
    cache: str | None = Field(None, description="gymloop's SWE cache (sdists, repositories, the test runner).")
    slots: int = Field(2, ge=1, description="Sandbox slots: tests of this many episodes run at once.")
    max_tool_calls: int = Field(30, ge=1, description="Tool calls per episode; later calls are refused.")
    max_test_runs: int = Field(5, ge=0, description="run_tests calls per episode.")
    test_timeout_s: float = Field(60.0, gt=0, description="Wall-clock limit of one test run (run_tests or verification).")
    test_memory_mb: int = Field(1024, ge=64, description="Address space of the test process.")
    output_chars: int = Field(3000, ge=200, description="run_tests output kept for the model.")
    prompt: Literal["full", "compact"] = Field(
        "full", description="full: the tools' schemas in the request and the whole problem statement; compact "
        "(for models with a few hundred positions, such as nano): no schemas (one line names the tools and "
        "their arguments), the statement cut to its first line and the error's first line.")


class SweEnv(Environment):
    name = "swe"

    def __init__(self, config: SweConfig) -> None:
        self.config = config
        cache = Path(config.cache) if config.cache else default_cache()
        self.tasks_file = Path(config.tasks) if config.tasks else cache / "tasks.jsonl"
        self.repos = Path(config.repos) if config.repos else cache / "repos"
        self.cache = cache
        self._instances: dict[str, Instance] | None = None
        self._harness: Harness | None = None
        self._lock = threading.Lock()
        if config.tasks:                       # a file named in a config is read (and checked) now
            self.instances  # noqa: B018

    @property
    def instances(self) -> dict[str, Instance]:
        """instance_id -> Instance, read on first use (the default file, the built tasks, may not
        exist yet when a config naming this environment is validated)."""
        if self._instances is None:
            if not self.tasks_file.exists():
                raise FileNotFoundError(f"{self.tasks_file} does not exist: run `gymloop swe build` or give "
                                        "options.tasks")
            self._instances = {i.instance_id: i for i in load_instances(self.tasks_file)}
        return self._instances

    @property
    def harness(self) -> Harness:
        """The sandbox pool and harness, made on first use (validating a config builds the
        environment and never runs a test)."""
        with self._lock:                # verify_batch's threads ask for it at once: one pool, not one each
            if self._harness is None:
                limits = Limits(timeout_s=self.config.test_timeout_s, memory_mb=self.config.test_memory_mb,
                                tmpfs_mb=128)
                self._harness = Harness(Pool(slots=self.config.slots, limits=limits), self.repos, self.cache,
                                        limits=limits)
            return self._harness

    def __getstate__(self) -> dict:
        """Sent to another process (a Ray worker) without its pool and lock: made again there on use."""
        return {**self.__dict__, "_harness": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def close(self) -> None:
        if self._harness is not None:
            self._harness.pool.close()
            self._harness = None

    # --- tasks ------------------------------------------------------------------------
    def task(self, inst: Instance) -> Task:
        if self.config.prompt == "compact":
            prompt = ({"role": "system", "content": COMPACT_SYSTEM},
                      {"role": "user", "content": compact_statement(inst.problem_statement)})
        else:
            prompt = ({"role": "system", "content": SYSTEM},
                      {"role": "user", "content": inst.problem_statement})
        return Task(id=inst.instance_id, env=self.name, prompt=prompt, answer=None, split=inst.split,
                    source="dataset", info={"instance_id": inst.instance_id})

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        pool = sorted(i for i, inst in self.instances.items() if inst.split == split)
        if n > len(pool):
            raise ValueError(f"asked for {n} {split} swe tasks; the task file has {len(pool)}")
        return [self.task(self.instances[i]) for i in random.Random(f"swe|{split}|{seed}").sample(pool, n)]

    def all_tasks(self) -> list[Task]:
        return [self.task(i) for i in self.instances.values()]

    def task_from_id(self, task_id: str) -> Task:
        if task_id not in self.instances:
            raise ValueError(f"no swe task {task_id!r} in the task file")
        return self.task(self.instances[task_id])

    def tools(self, task: Task) -> list[dict]:
        return SCHEMAS if self.config.prompt == "full" else []

    # --- episode ----------------------------------------------------------------------
    def _replay(self, inst: Instance, messages: list[Message]) -> tuple[Workspace, int, int]:
        """The workspace after the edits of `messages`; (workspace, tool calls, test runs)."""
        ws = Workspace(base_tree(inst, self.repos))      # no sandbox needed to read the tree
        calls = runs = 0
        for m in messages:
            if m["role"] != "assistant":
                continue
            for c in parse_tool_calls(m["content"]).calls:
                calls += 1
                if calls > self.config.max_tool_calls:
                    continue
                if c.name == "edit":
                    call_tool(ws, c.name, c.arguments)
                runs += c.name == "run_tests"
        return ws, calls, runs

    def step(self, task: Task, messages: list[Message], assistant_text: str) -> StepResult:
        parsed = parse_tool_calls(assistant_text)
        if not parsed.calls and not parsed.errors:
            return StepResult((), done=True)          # no call: the episode ends, the edits so far are the patch
        inst = self.instances[task.id]
        ws, calls, runs = self._replay(inst, messages[:-1])
        payloads: list[dict] = [{"error": e} for e in parsed.errors]
        done = False
        for c in parsed.calls:
            calls += 1
            if calls > self.config.max_tool_calls:
                payloads.append({"error": f"tool-call limit of {self.config.max_tool_calls} per episode reached; submit()"})
            elif c.name == "submit":
                done = True
            elif c.name == "run_tests":
                runs += 1
                payloads.append(self._run_tests(inst, ws, c.arguments, runs))
            else:
                payloads.append(call_tool(ws, c.name, c.arguments))
        if done:
            return StepResult((), done=True)
        return StepResult(tuple({"role": "tool", "content": tool_response(p)} for p in payloads), done=False)

    def _run_tests(self, inst: Instance, ws: Workspace, arguments: dict, n: int) -> dict:
        tests = arguments.get("tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            return {"error": "run_tests takes {\"tests\": [node ids]}, e.g. the failing test of the problem statement"}
        if n > self.config.max_test_runs:
            return {"error": f"run_tests limit of {self.config.max_test_runs} per episode reached"}
        if any(t.startswith("-") for t in tests):
            return {"error": "tests are pytest node ids (path::name), not options"}
        run = self.harness.run(inst, ws.files(), tests[:50])
        if run.error:
            return {"error": f"the sandbox failed: {run.error}"}
        out = {"status": run.status, "finished": run.finished}
        text = "\n\n".join(f"{t}:\n{f['text']}" for t, f in run.failures.items())
        if not run.finished:
            text = run.output_tail
        out["output"] = text[-self.config.output_chars:]
        return out

    # --- verification -----------------------------------------------------------------
    def patch_of(self, task: Task, messages: list[Message]) -> str:
        """The episode's final diff: what is verified."""
        return self._replay(self.instances[task.id], messages)[0].diff()

    @staticmethod
    def score(v: Verdict) -> Score:
        f2p = sum(v.fail_to_pass.values()) / len(v.fail_to_pass) if v.fail_to_pass else 0.0
        p2p = sum(v.pass_to_pass.values()) / len(v.pass_to_pass) if v.pass_to_pass else 1.0
        comps = {"resolved": float(v.resolved), "fail_to_pass": f2p, "pass_to_pass": p2p}
        return Score(v.reward, comps, v.reason, error=v.error)

    def verify(self, task: Task, messages: list[Message]) -> Score:
        inst = self.instances[task.id]
        return self.score(self.harness.verify(inst, self.patch_of(task, messages)))

    def verify_batch(self, items: list[tuple[Task, list[Message]]]) -> list[Score]:
        with cf.ThreadPoolExecutor(self.config.slots) as ex:
            return list(ex.map(lambda tm: self.verify(*tm), items))

    # --- validation -------------------------------------------------------------------
    def gold_turns(self, task: Task) -> list[str]:
        """Edits that make the gold patch (each hunk's old lines -> new lines, context included), then submit."""
        return [format_call("edit", args) for args in hunk_edits(self.instances[task.id].patch)] + [format_call("submit", {})]

    def wrong_turns(self, task: Task) -> list[str]:
        return [format_call("submit", {})]        # no change: the bug stays


def hunk_edits(patch: str) -> list[dict]:
    """A unified diff as edit() calls: per hunk, its context and removed lines -> context and added."""
    edits, path, old, new, in_hunk = [], None, [], [], False

    def flush():
        if in_hunk and path:
            edits.append({"path": path, "old": "".join(old), "new": "".join(new)})

    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
        elif line.startswith("@@"):
            flush()
            old, new, in_hunk = [], [], True
        elif in_hunk and line.startswith(" "):
            old.append(line[1:])
            new.append(line[1:])
        elif in_hunk and line.startswith("-") and not line.startswith("--- "):
            old.append(line[1:])
        elif in_hunk and line.startswith("+"):
            new.append(line[1:])
        elif in_hunk and line.startswith("\\"):          # "\ No newline at end of file": the line before has none
            for side in (old, new):
                if side and side[-1].endswith("\n"):
                    side[-1] = side[-1][:-1]
        elif line.startswith("diff --git"):
            flush()
            in_hunk = False
    flush()
    return edits


def make_swe(**options) -> SweEnv:
    return SweEnv(SweConfig(**options))
