"""A coding agent's tools over a repository held as an overlay: the task's base tree (shared,
read-only) plus the files this episode edited. Nothing is copied per step; the episode's state is
rebuilt from its messages by replaying its edits (the environment protocol is stateless).

The tools, as OpenAI function schemas (SCHEMAS) and as functions (TOOLS: name -> function):
list_files(path), read_file(path, start, end), search(pattern, path), edit(path, old, new),
run_tests(tests), submit(). Each returns a JSON-able payload; a bad call returns {"error": ...}.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable, Mapping

from .repos import Tree, unified_diff

MAX_READ_LINES = 200
MAX_CHARS = 12_000
MAX_MATCHES = 50
MAX_PATTERN = 200


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


SCHEMAS: list[dict] = [
    _fn("list_files", "List the files and directories directly under a directory of the repository.",
        {"path": {"type": "string", "description": "Directory, relative to the repository root ('.' for the root)."}}, []),
    _fn("read_file", "Read lines of a file, numbered (at most 200 lines per call).",
        {"path": {"type": "string"}, "start": {"type": "integer", "description": "First line, 1-based."},
         "end": {"type": "integer", "description": "Last line, inclusive."}}, ["path"]),
    _fn("search", "Search the repository's files for a regular expression; returns path:line: text.",
        {"pattern": {"type": "string"}, "path": {"type": "string", "description": "Directory or file to search in."}},
        ["pattern"]),
    _fn("edit", "Replace the exact text `old` by `new` in a file. `old` must occur exactly once.",
        {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}, ["path", "old", "new"]),
    _fn("run_tests", "Run some of the repository's tests (pytest node ids) on the current code; the output is "
        "truncated.", {"tests": {"type": "array", "items": {"type": "string"}}}, ["tests"]),
    _fn("submit", "Finish: the current changes are the patch that is verified.", {}, []),
]


@dataclass
class Workspace:
    """The repository as this episode sees it."""

    base: Tree
    edits: dict[str, bytes] = field(default_factory=dict)

    def files(self) -> Mapping[str, bytes]:
        return {**self.base, **self.edits} if self.edits else self.base

    def get(self, path: str) -> bytes | None:
        return self.edits.get(path, self.base.get(path))

    def diff(self) -> str:
        return unified_diff({p: self.base[p] for p in self.edits if p in self.base}, self.edits)


class ToolError(ValueError):
    """A bad call: its message goes back to the model."""


def _rel(path: str | None, default: str = ".") -> str:
    p = PurePosixPath(path or default)
    if p.is_absolute() or ".." in p.parts:
        raise ToolError(f"path {path!r} must be relative to the repository root and stay inside it")
    s = str(p)
    return "" if s == "." else s


def list_files(ws: Workspace, path: str = ".") -> dict:
    root = _rel(path)
    prefix = f"{root}/" if root else ""
    names = set()
    for p in ws.files():
        if p.startswith(prefix):
            head, sep, _ = p[len(prefix):].partition("/")
            names.add(head + ("/" if sep else ""))
    if not names:
        raise ToolError(f"no directory {path!r} in the repository")
    return {"path": path or ".", "entries": sorted(names)}


def read_file(ws: Workspace, path: str, start: int = 1, end: int | None = None) -> dict:
    data = ws.get(_rel(path))
    if data is None:
        raise ToolError(f"no file {path!r} in the repository")
    lines = data.decode(errors="replace").splitlines()
    start = max(1, int(start))
    end = min(len(lines), int(end) if end is not None else start + MAX_READ_LINES - 1, start + MAX_READ_LINES - 1)
    text = "\n".join(f"{n:5d}  {lines[n - 1]}" for n in range(start, end + 1))
    return {"path": path, "lines": f"{start}-{end} of {len(lines)}", "text": text[:MAX_CHARS]}


def search(ws: Workspace, pattern: str, path: str = ".") -> dict:
    if len(pattern) > MAX_PATTERN:
        raise ToolError(f"pattern longer than {MAX_PATTERN} characters")
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"bad regular expression: {exc}") from None
    root = _rel(path)
    matches = []
    for p in sorted(ws.files()):
        if root and p != root and not p.startswith(root + "/"):
            continue
        for n, line in enumerate(ws.get(p).decode(errors="replace").splitlines(), 1):
            if len(line) < 2000 and rx.search(line):
                matches.append(f"{p}:{n}: {line.strip()[:200]}")
                if len(matches) >= MAX_MATCHES:
                    return {"matches": matches, "truncated": True}
    return {"matches": matches, "truncated": False}


def edit(ws: Workspace, path: str, old: str, new: str) -> dict:
    rel = _rel(path)
    data = ws.get(rel)
    if data is None:
        raise ToolError(f"no file {path!r} in the repository")
    text = data.decode(errors="replace")
    count = text.count(old) if old else 0
    if count == 0:
        raise ToolError(f"`old` does not occur in {path}" + ("" if old else " (it is empty)"))
    if count > 1:
        raise ToolError(f"`old` occurs {count} times in {path}: include more surrounding lines so it is unique")
    ws.edits[rel] = text.replace(old, new, 1).encode()
    return {"path": path, "ok": True}


# run_tests and submit need the episode (the sandbox, the task's tests): the environment runs them
TOOLS: dict[str, Callable[..., dict]] = {"list_files": list_files, "read_file": read_file, "search": search, "edit": edit}


def call_tool(ws: Workspace, name: str, arguments: dict) -> dict:
    """Run one of TOOLS; a bad call's error comes back as {"error": ...}."""
    fn = TOOLS.get(name)
    if fn is None:
        return {"error": f"unknown tool {name!r}; available: {[s['function']['name'] for s in SCHEMAS]}"}
    try:
        return fn(ws, **arguments)
    except ToolError as exc:
        return {"error": str(exc)}
    except (TypeError, ValueError) as exc:
        return {"error": f"bad arguments for {name}: {exc}"}
