"""Running a user's agent program for one episode: a Python function (`harness: module:function`)
or any command (`command: [argv...]`), given a task, an OpenAI endpoint and a key; what it returns
is its reward.

    function(task: dict, client, model: str) -> float | {"reward": x, "components": {...}}
        sync: `client` is an `openai.OpenAI`; `async def`: an `openai.AsyncOpenAI` (on the
        episode's own event loop)
    command: OPENAI_BASE_URL, OPENAI_API_KEY, GYMLOOP_MODEL, GYMLOOP_TASK (the task's JSON) set;
        its last line of stdout is {"reward": x, ...}

A program that raises, exits non-zero, prints no reward, returns a reward outside [0, 1] or runs
past its time limit has failed as a program (`ProgramError`): the episode says nothing about the
model, so it is left out of training and counted, never scored 0.
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .. import watchdog


class ProgramError(RuntimeError):
    """The program failed (not the model): one line saying how."""


@dataclass(frozen=True)
class Outcome:
    reward: float
    components: dict[str, float] = field(default_factory=dict)


def outcome(value: Any, task_id: str) -> Outcome:
    """A program's result as an Outcome: a number in [0, 1], or {"reward": x, "components": {...}}."""
    if isinstance(value, dict):
        if "reward" not in value:
            raise ProgramError(f"task {task_id}: the program's result has no 'reward' ({_short(value)})")
        comps = value.get("components") or {}
        if not isinstance(comps, dict) or not all(_number(v) for v in comps.values()):
            raise ProgramError(f"task {task_id}: 'components' must map names to numbers ({_short(comps)})")
        reward, components = value["reward"], {str(k): float(v) for k, v in comps.items()}
    else:
        reward, components = value, {}
    if not _number(reward):
        raise ProgramError(f"task {task_id}: the reward must be a number, not {_short(reward)}")
    if not 0.0 <= float(reward) <= 1.0:
        raise ProgramError(f"task {task_id}: reward {float(reward):g} is outside [0, 1]")
    return Outcome(float(reward), components)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _short(x: Any, n: int = 120) -> str:
    text = repr(x)
    return text if len(text) <= n else text[:n] + "..."


# A program run: (task as the program sees it, base_url, api_key, model, timeout_s, http) -> Outcome.
# `http`: an httpx client the episodes share (its connections, and one TLS context instead of one
# per client: building that context cost ~20 ms an episode), or None.
Runner = Callable[..., Outcome]
# ... of an async program: awaited on the episodes' event loop (`http` an httpx.AsyncClient)
AsyncRunner = Callable[..., Awaitable[Outcome]]


def load_function(target: str, path: str | None = None) -> Callable:
    """`module:function`, imported (with `path` first on the import path)."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"harness {target!r} must be 'module:function'")
    if path is not None:
        path = os.path.abspath(path)
        if not os.path.isdir(path):
            raise ValueError(f"harness path {path} is not a directory")
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"harness {target!r}: cannot import it ({type(exc).__name__}: {exc})") from None
    if not callable(fn):
        raise ValueError(f"harness {target!r} is not a function")
    return fn


def function_runner(fn: Callable) -> Runner | AsyncRunner:
    """Runs `fn` once per episode under the time limit: a sync function in the calling thread (a
    worker of the episode pool) with an `openai.OpenAI`; an async one (an AsyncRunner) as a task
    of the episodes' one event loop, with an `openai.AsyncOpenAI` of its own."""
    if inspect.iscoroutinefunction(fn):
        async def arun(task: dict, base_url: str, key: str, model: str, timeout_s: float, http=None) -> Outcome:
            import openai

            task_id = str(task.get("id"))
            client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s,
                                        http_client=http)
            try:
                value = await asyncio.wait_for(fn(task, client, model), timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                raise ProgramError(f"task {task_id}: the program ran past timeout_s {timeout_s:g}") from None
            except ProgramError:
                raise
            except Exception as exc:  # noqa: BLE001 - the program's own failure, reported as such
                raise ProgramError(f"task {task_id}: the program raised {type(exc).__name__}: {_line(exc)}") from None
            return outcome(value, task_id)

        return arun

    def run(task: dict, base_url: str, key: str, model: str, timeout_s: float, http=None) -> Outcome:
        import openai

        task_id = str(task.get("id"))
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s, http_client=http)
        try:
            value = _within(lambda: fn(task, client, model), timeout_s)
        except TimeoutError:
            raise ProgramError(f"task {task_id}: the program ran past timeout_s {timeout_s:g}") from None
        except Exception as exc:  # noqa: BLE001 - the program's own failure, reported as such
            raise ProgramError(f"task {task_id}: the program raised {type(exc).__name__}: {_line(exc)}") from None
        return outcome(value, task_id)

    return run


def _within(call: Callable[[], Any], timeout_s: float) -> Any:
    """`call()` in a thread of its own, waited for at most `timeout_s` (a sync program cannot be
    interrupted; one left running past its limit has its key closed by the caller, so its next
    model call fails)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, name="agent-program", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box["value"]


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "(no message)"


def command_runner(argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> Runner:
    """Runs `argv` once per episode in a session of its own (killed whole at the time limit)."""
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise ValueError("command must be a non-empty list of strings (argv)")

    def run(task: dict, base_url: str, key: str, model: str, timeout_s: float, http=None) -> Outcome:
        task_id = str(task.get("id"))
        environ = {**os.environ, **(env or {}), "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key,
                   "GYMLOOP_MODEL": model, "GYMLOOP_TASK": json.dumps(task)}
        if shutil.which(argv[0], path=environ.get("PATH")) is None and not os.access(argv[0], os.X_OK):
            raise ProgramError(f"task {task_id}: cannot start {argv[0]!r}: no such executable")
        # under gymloop's watchdog: the program and what it starts die with gymloop, SIGKILL included
        proc = subprocess.Popen(watchdog.command(argv), cwd=cwd, env=watchdog.environ(environ),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise ProgramError(f"task {task_id}: the program ran past timeout_s {timeout_s:g}") from None
        finally:
            _kill_group(proc)        # nothing it started outlives the episode
        if proc.returncode != 0:
            tail = (err or "").strip().splitlines()
            raise ProgramError(f"task {task_id}: the program exited with {proc.returncode}"
                               + (f": {tail[-1][:300]}" if tail else ""))
        lines = [ln for ln in (out or "").strip().splitlines() if ln.strip()]
        if not lines:
            raise ProgramError(f"task {task_id}: the program printed no reward (its last stdout line must be "
                               '{"reward": x})')
        try:
            value = json.loads(lines[-1])
        except json.JSONDecodeError:
            raise ProgramError(f"task {task_id}: its last stdout line is not JSON: {lines[-1][:200]!r}") from None
        if not isinstance(value, dict):
            raise ProgramError(f"task {task_id}: its last stdout line must be a JSON object with 'reward'")
        return outcome(value, task_id)

    return run


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
