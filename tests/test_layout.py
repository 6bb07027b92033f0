"""The package layout: imports between gymloop's packages go one way (no cycle), and every
name of `gymloop.__all__` imports."""
from __future__ import annotations

import ast
from pathlib import Path

import gymloop

ROOT = Path(gymloop.__file__).parent


def _package_imports() -> dict[str, set[str]]:
    """package -> the other top-level gymloop packages (or modules) it imports, lazily or not."""
    edges: dict[str, set[str]] = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        pkg = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if pkg == "__init__":
            continue                 # gymloop/__init__ re-exports every package by design
        here = ["gymloop", *rel.with_suffix("").parts]
        if here[-1] == "__init__":
            here = here[:-1] + ["__init__"]
        for node in ast.walk(ast.parse(f.read_text())):
            mods: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level] if node.level else []
                mod = base + (node.module.split(".") if node.module else [])
                mods = [mod + [a.name] for a in node.names] if len(mod) == 1 else [mod]
            elif isinstance(node, ast.Import):
                mods = [a.name.split(".") for a in node.names]
            for m in mods:
                if m[:1] == ["gymloop"] and len(m) > 1 and m[1] != pkg:
                    edges.setdefault(pkg, set()).add(m[1])
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    def reach(a: str) -> set[str]:
        seen, todo = set(), [a]
        while todo:
            for b in edges.get(todo.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen
    return sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in reach(b)})


def test_the_import_graph_sees_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_cycle_between_packages():
    edges = _package_imports()
    assert "orchestrator" in edges and "trainer" in edges["orchestrator"]     # the graph is read
    assert _cycles(edges) == []


def test_every_public_name_imports():
    for name in gymloop.__all__:
        assert getattr(gymloop, name) is not None, name
