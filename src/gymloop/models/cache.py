"""Where gymloop keeps what it builds: pre-trained nano bases and converted models."""
from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`$GYMLOOP_CACHE`, or `~/.cache/gymloop` (models live under `models/` in it)."""
    return Path(os.environ.get("GYMLOOP_CACHE", Path.home() / ".cache" / "gymloop"))
