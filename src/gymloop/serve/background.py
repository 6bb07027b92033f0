"""Serve an app with uvicorn in a background thread on loopback (the demo's production, tests)."""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Iterator

from ..net import free_port


class ServerThread:
    """`with ServerThread(app) as base_url:` — returns once /healthz answers; stops on exit."""

    def __init__(self, app, port: int | None = None, start_timeout_s: float = 10.0) -> None:
        self.app, self.port, self.start_timeout_s = app, port, start_timeout_s

    def __enter__(self) -> str:
        import uvicorn

        port = self.port or free_port()
        self.srv = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.srv.run, name="gymloop-server", daemon=True)
        self.thread.start()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).close()
                return base
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if not self.thread.is_alive():
                    break
                time.sleep(0.05)
        self.srv.should_exit = True
        raise RuntimeError(f"gymloop server did not answer on {base}/healthz within {self.start_timeout_s} s")

    def __exit__(self, *exc) -> None:
        self.srv.should_exit = True
        self.thread.join(5)


@contextmanager
def serving(cfg) -> Iterator[tuple[str, object, object]]:
    """`with serving(ServeConfig(...)) as (base_url, batcher, store):` builds the server, serves it
    on loopback in a thread, and on exit stops it, closes the batcher and flushes the serving
    ledger, so the last seconds of serving are priced too."""
    from . import build, shutdown

    app, batcher, store = build(cfg)
    try:
        with ServerThread(app) as url:
            yield url, batcher, store
    finally:
        shutdown(app)
