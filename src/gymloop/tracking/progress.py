"""Progress bars for long work: live on a terminal, sparse in logs and CI output."""
from __future__ import annotations

import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def progress(it: Iterable[T] | None, desc: str, enabled: bool = True, unit: str = "step", **kw):
    """tqdm over `it`, or a counter to `.update(n)` when `it` is None (pass `total=`)."""
    from tqdm.auto import tqdm

    tty = sys.stderr.isatty()
    # Redrawn lines fill a log file with thousands of copies: off a TTY, redraw every 15 s.
    return tqdm(it, desc=desc, disable=not enabled, unit=unit, mininterval=0.2 if tty else 15.0,
                dynamic_ncols=tty, **kw)
