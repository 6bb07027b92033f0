"""The shape of every algorithm table: name -> (implementation, one line), and the one lookup
that names what is known when a name is not."""
from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Table(dict, Generic[T]):
    """`Table(kind, {name: (implementation, description)})`; `table.impl(name)` or a clear error."""

    def __init__(self, kind: str, entries: dict[str, tuple[T, str]]) -> None:
        super().__init__(entries)
        self.kind = kind

    def impl(self, name: str) -> T:
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self)}")
        return self[name][0]

    def describe(self) -> list[tuple[str, str]]:
        return [(name, line) for name, (_, line) in self.items()]
