"""Procedural bugs, as SWE-smith injects them: small edits of one expression or statement of a
function, found on the module's syntax tree and made on its exact source text (the rest of the
file keeps every byte, so the fix is a one-or-few-line diff).

    for m in mutations(source, path): m.source (the buggy module), m.function, m.operator

The operators are a name -> function table (OPERATORS); each yields (start, end, replacement)
edits in UTF-8 byte offsets of the source.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Iterator

Edit = tuple[int, int, str]          # (start byte, end byte, replacement text)


@dataclass(frozen=True)
class Mutation:
    path: str          # the module's path in the repository
    function: str      # qualified name of the function the edit is in (Class.method)
    operator: str      # the OPERATORS name
    line: int          # first line of the edit (1-based)
    source: bytes      # the whole mutated module
    description: str   # what changed, e.g. "'<' -> '<='"


class Source:
    """A module's text with byte offsets for ast positions (col_offset counts UTF-8 bytes)."""

    def __init__(self, text: bytes) -> None:
        self.text = text
        self.starts = [0]
        for line in text.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, a: int, b: int) -> str:
        return self.text[a:b].decode()


def _gap_replace(src: Source, left: ast.AST, right: ast.AST, old: str, new: str) -> Edit | None:
    """Replace the operator token `old` between two operands (the gap holds only it, spaces,
    parentheses and comments)."""
    a, b = src.span(left)[1], src.span(right)[0]
    gap = src.segment(a, b)
    i = gap.find(old)
    if i < 0 or gap.count(old) != 1:
        return None
    start = a + len(gap[:i].encode())
    return start, start + len(old.encode()), new


COMPARE_FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
                 ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}
ARITH_FLIPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.FloorDiv: ("//", "/"), ast.Mult: ("*", "//")}
BOOL_FLIPS = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


def compare_flip(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE_FLIPS:
        old, new = COMPARE_FLIPS[type(node.ops[0])]
        e = _gap_replace(src, node.left, node.comparators[0], old, new)
        if e:
            yield e, f"{old!r} -> {new!r}"


def arith_flip(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    if isinstance(node, ast.BinOp) and type(node.op) in ARITH_FLIPS:
        if any(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (node.left, node.right)):
            return          # string concatenation / formatting: the flip is a TypeError, not a bug to find
        old, new = ARITH_FLIPS[type(node.op)]
        e = _gap_replace(src, node.left, node.right, old, new)
        if e:
            yield e, f"{old!r} -> {new!r}"


def bool_flip(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = BOOL_FLIPS[type(node.op)]
        e = _gap_replace(src, node.values[0], node.values[1], old, new)
        if e:
            yield e, f"{old!r} -> {new!r}"


def drop_not(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        a, b = src.offset(node.lineno, node.col_offset), src.span(node.operand)[0]
        if src.segment(a, b).strip() == "not":
            yield (a, b, ""), "'not' dropped"


def off_by_one(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    """An integer bound of a slice, a subscript or a range() call, one more or one less."""
    targets: list[ast.AST] = []
    if isinstance(node, ast.Slice):
        targets = [x for x in (node.lower, node.upper) if x is not None]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        targets = list(node.args)
    elif isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
        targets = [node.slice]
    for t in targets:
        value = t.operand.value if (isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.USub)
                                    and isinstance(t.operand, ast.Constant)) else getattr(t, "value", None)
        if isinstance(t, ast.UnaryOp) and isinstance(value, int):
            value = -value
        if isinstance(value, int) and not isinstance(value, bool) and (isinstance(t, ast.Constant) or isinstance(t, ast.UnaryOp)):
            a, b = src.span(t)
            new = value + 1 if value >= 0 else value - 1
            yield (a, b, str(new)), f"{value} -> {new}"
        elif isinstance(t, ast.BinOp) and isinstance(t.op, (ast.Add, ast.Sub)) and isinstance(t.right, ast.Constant) \
                and isinstance(t.right.value, int) and not isinstance(t.right.value, bool):
            a, b = src.span(t.right)
            yield (a, b, str(t.right.value + 1)), f"{t.right.value} -> {t.right.value + 1}"


def swap_args(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    if isinstance(node, ast.Call) and len(node.args) >= 2 and all(isinstance(a, ast.Name) for a in node.args[:2]):
        x, y = node.args[:2]
        if x.id != y.id:
            (a0, b0), (a1, b1) = src.span(x), src.span(y)
            # one edit over both arguments: the text between them stays
            yield (a0, b1, y.id + src.segment(b0, a1) + x.id), f"arguments {x.id}, {y.id} swapped"


def default_value(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for d in [*node.args.defaults, *[k for k in node.args.kw_defaults if k is not None]]:
            if isinstance(d, ast.Constant) and d.value in (True, False) and isinstance(d.value, bool):
                a, b = src.span(d)
                yield (a, b, str(not d.value)), f"default {d.value} -> {not d.value}"
            elif isinstance(d, ast.Constant) and isinstance(d.value, int) and not isinstance(d.value, bool):
                a, b = src.span(d)
                yield (a, b, str(d.value + 1)), f"default {d.value} -> {d.value + 1}"


def remove_branch(src: Source, node: ast.AST) -> Iterator[tuple[Edit, str]]:
    """An `if` without `else` whose body ends the function or the loop turn early: removed."""
    for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
        if not isinstance(body, list):
            continue
        for stmt in body:
            if isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                a = src.starts[stmt.lineno - 1]
                b = src.starts[stmt.end_lineno]
                indent = src.text[a:src.offset(stmt.lineno, stmt.col_offset)].decode()
                keep = "" if len(body) > 1 else f"{indent}pass\n"
                yield (a, b, keep), f"the early '{type(stmt.body[-1]).__name__.lower()}' branch at line {stmt.lineno} removed"


OPERATORS: dict[str, Callable[[Source, ast.AST], Iterator[tuple[Edit, str]]]] = {
    "compare_flip": compare_flip, "arith_flip": arith_flip, "bool_flip": bool_flip, "drop_not": drop_not,
    "off_by_one": off_by_one, "swap_args": swap_args, "default_value": default_value, "remove_branch": remove_branch,
}


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function, nested ones included."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def mutations(text: bytes, path: str) -> Iterator[Mutation]:
    """Every mutation of every function of the module (in source order), each one compiling."""
    src = Source(text)
    tree = ast.parse(text)
    seen: set[tuple[int, int, str]] = set()
    for qualname, fn in _functions(tree):
        inner = {id(n) for _, f in _functions(fn) for n in ast.walk(f)}      # nested functions: their own
        for node in ast.walk(fn):
            if id(node) in inner:
                continue
            for name, op in OPERATORS.items():
                if name == "default_value" and node is not fn:
                    continue
                for (a, b, new), what in op(src, node):
                    if (a, b, new) in seen:
                        continue
                    seen.add((a, b, new))
                    mutated = text[:a] + new.encode() + text[b:]
                    try:
                        compile(mutated, path, "exec")
                    except SyntaxError:
                        continue
                    line = text[:a].count(b"\n") + 1
                    yield Mutation(path, qualname, name, line, mutated, what)
