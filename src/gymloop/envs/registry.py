"""Where environment names come from: one table of built-ins, environments registered in code,
installed plugin packages, and `module:factory` references.

A plugin package declares its environments in the entry-point group `gymloop.envs`:

    [project.entry-points."gymloop.envs"]
    mygame = "mygame.env:make_env"         # factory(**options) -> gymloop.envs.Environment

and `gymloop envs list`, `envs validate`, `train` and `run` find it by that name once it is
installed, with no change to gymloop. A config may also name a factory directly
(`env: {name: "mygame.env:make_env"}`). docs/environments.md describes the protocol.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

from .base import Environment

GROUP = "gymloop.envs"
Factory = Callable[..., Environment]


@dataclass(frozen=True)
class EnvEntry:
    """One environment name: how to build it, one line on what it verifies, where it came from."""

    name: str
    factory: Factory
    description: str
    source: str = "builtin"          # builtin | registered | plugin:<distribution>
    # check(**options): the options checked without starting anything, for an environment whose
    # building starts a process (a peer's server or bridge); others are built and closed to check
    check: Callable[..., None] | None = None


def _lazy(module: str, factory: str) -> Factory:
    """A factory imported only when used (code and HumanEval pull in the sandbox and datasets)."""
    def build(**options: Any) -> Environment:
        return getattr(importlib.import_module(module, __package__), factory)(**options)

    build.__name__ = factory
    return build


BUILTIN: tuple[EnvEntry, ...] = (
    EnvEntry("arith", _lazy(".arith", "make_arith"), "procedural arithmetic; the last integer of the reply is checked"),
    EnvEntry("tools", _lazy(".tools", "make_tools"),
             "multi-turn tool use over an inventory API that changes (version: 1, 2 or 3; tools@v3 is shorthand): v2 "
             "returns {sku, quantity} instead of {item, count}, v3 also renames the tools and their arguments; an "
             "answer counts only after a valid call; schemas: false keeps the tool list out of the prompt"),
    EnvEntry("calls", _lazy(".calls", "make_calls"),
             "call the right tool with the right arguments from the schemas in the request; held-out tasks use "
             "tools training never shows (heldout: requests: the same tools, unseen requests; new-tool-requests: "
             "the held-out tools in every split, unseen requests held out); calls@v2 renames "
             "every tool and argument"),
    EnvEntry("code", _lazy(".code", "make_code"), "write a Python function; hidden tests run in the sandbox"),
    EnvEntry("code-repo", _lazy(".code", "make_code_repo"),
             "fix a bug in a tiny multi-file project; its own unittest suite decides"),
    EnvEntry("swe", _lazy("..swe.env", "make_swe"),
             "fix a real bug in a real repository with tools (SWE-bench format: tasks: FILE, repos: DIR); "
             "the project's own tests decide, in the sandbox"),
    EnvEntry("nemo_gym", _lazy(".nemo_gym", "make_nemo_gym"),
             "a NeMo Gym resources server, unchanged (server: module:Class, or url), in NeMo Gym's runtime; its "
             "/verify is the reward (`gymloop envs install nemo-gym`)", check=_lazy(".nemo_gym", "check_nemo_gym")),
    EnvEntry("verifiers", _lazy(".verifiers", "make_verifiers"),
             "a verifiers environment, unchanged (env: its id, args: load_environment's), in verifiers' runtime; "
             "its rubric is the reward (`gymloop envs install verifiers --with YOUR_ENV`)", check=_lazy(".verifiers", "check_verifiers")),
    EnvEntry("openenv", _lazy(".openenv", "make_openenv"),
             "an OpenEnv server, unchanged (app: module:app, or url), in OpenEnv's runtime; the return is the reward "
             "(`gymloop envs install openenv`)", check=_lazy(".openenv", "check_openenv")),
    EnvEntry("agent", _lazy("..agents.env", "make_agent"),
             "your agent program, unchanged (harness: module:function, or command: [argv]), on tasks from a file "
             "(tasks: FILE.jsonl); it calls the model through an OpenAI endpoint and returns its reward"),
    EnvEntry("humaneval", _lazy(".humaneval", "make_humaneval"), "the 164 HumanEval problems, their own tests in the sandbox"),
    EnvEntry("reasoning_gym", _lazy(".reasoning_gym", "make_reasoning_gym"),
             "any reasoning-gym dataset (dataset: NAME), scored by its own scorer"),
    EnvEntry("jsonl", _lazy(".jsonl", "make_jsonl"),
             "tasks from a JSONL file (path: FILE), checked by a named checker (exact, last_int, regex, python)"),
    EnvEntry("graded", _lazy(".graded", "make_graded"),
             "prompts from a reinforcement fine-tuning file (path: FILE), each reply scored by a grader "
             "(grader: {type: python | string_check | text_similarity | score_model | multi, ...})"),
)

# built-ins that build only from a file (options path: ...); `validate all` skips them
NEEDS_FILE = ("jsonl", "graded", "swe", "openenv", "nemo_gym", "verifiers", "agent")   # swe: the tasks `gymloop swe build` makes; openenv: a server


class Registry:
    """The environment table. Built-ins and `register`ed names are looked up first; installed
    plugins are read from their entry points when a name is not found, or when listing."""

    def __init__(self, entries: tuple[EnvEntry, ...] = BUILTIN) -> None:
        self._entries: dict[str, EnvEntry] = {e.name: e for e in entries}
        self._plugins: dict[str, metadata.EntryPoint] | None = None

    def register(self, name: str, factory: Factory, description: str, source: str = "registered") -> None:
        if not name or "@" in name or ":" in name:
            raise ValueError(f"environment name {name!r} must be non-empty, without '@' or ':'")
        self._entries[name] = EnvEntry(name, factory, description, source)

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def copy(self) -> "Registry":
        """An independent table with the same entries (a test registers into a copy)."""
        other = Registry(tuple(self._entries.values()))
        other._plugins = self._plugins
        return other

    def _plugin_points(self) -> dict[str, metadata.EntryPoint]:
        if self._plugins is None:      # read once: installed packages do not change under a process
            self._plugins = {ep.name: ep for ep in metadata.entry_points(group=GROUP)}
        return self._plugins

    def _load_plugin(self, name: str) -> EnvEntry:
        ep = self._plugin_points()[name]
        try:
            factory = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is named, never a bare traceback
            raise ValueError(f"environment plugin {name!r} ({ep.value}) failed to load: "
                             f"{type(exc).__name__}: {exc}") from None
        doc = (getattr(factory, "description", None) or (factory.__doc__ or "").strip().split("\n")[0]
               or f"plugin environment from {ep.value}")
        dist = getattr(ep, "dist", None)
        entry = EnvEntry(name, factory, doc, f"plugin:{dist.name if dist else ep.value}")
        self._entries.setdefault(name, entry)
        return self._entries[name]

    def entries(self) -> list[EnvEntry]:
        """Every environment, plugins included (loading them)."""
        for name in self._plugin_points():
            if name not in self._entries:
                self._load_plugin(name)
        return list(self._entries.values())

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._plugin_points()})

    def factory(self, name: str) -> Factory:
        """The factory of a name, a plugin's entry-point name, or a `module:factory` reference."""
        if name in self._entries:
            return self._entries[name].factory
        if name in self._plugin_points():
            return self._load_plugin(name).factory
        if ":" in name:
            module, _, attr = name.partition(":")
            try:
                return getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"environment {name!r}: cannot import {attr!r} from {module!r} ({exc})") from None
        raise ValueError(f"unknown environment {name!r}; known: {self.names()} (or 'module:factory')")

    def check(self, name: str, **options: Any) -> None:
        """Whether `name` with `options` would build (a bad name or option raises ValueError),
        starting nothing: an environment that runs in another process checks its options by its
        entry's `check`; any other is built and closed."""
        name, options = _shorthand(name, options)
        entry = self._entries.get(name) or (self._load_plugin(name) if name in self._plugin_points() else None)
        check = entry.check if entry is not None else getattr(self.factory(name), "check", None)
        if check is None:
            self.make(name, **options).close()
            return
        try:
            check(**options)
        except TypeError as exc:          # an option the environment does not take
            raise ValueError(f"environment {name!r}: {exc}") from None

    def make(self, name: str, **options: Any) -> Environment:
        """Build an environment. `tools@v2` is shorthand for `tools` with version=2."""
        name, options = _shorthand(name, options)
        env = self.factory(name)(**options)
        if not isinstance(env, Environment):
            raise ValueError(f"environment {name!r}: its factory returned {type(env).__name__}, "
                             "not a gymloop.envs.Environment")
        return env


def _shorthand(name: str, options: dict) -> tuple[str, dict]:
    """`tools@v2` is `tools` with version=2."""
    if "@v" in name and ":" not in name:
        name, version = name.split("@v", 1)
        options = {**options, "version": int(version)}
    return name, options


def rebuilds_tasks(env: Environment) -> bool:
    """Whether the environment implements `task_from_id` (without it, production failures cannot
    become training tasks)."""
    return type(env).task_from_id is not Environment.task_from_id
