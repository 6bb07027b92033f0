"""gymloop's bridge to an OpenEnv server, run by OpenEnv's runtime python (its own venv), so it
imports nothing of gymloop: OpenEnv's own client (`GenericEnvClient`, one WebSocket session per
episode) speaks to the server, and gymloop speaks to this process in JSON lines.

    python -P bridge_runner.py openenv_bridge.py (--app module:app [--path DIR] [--sessions N] | --url URL)

With --app it serves the environment's own app (`create_app(...)`, unchanged; with --sessions,
rebuilt by the same create_app allowing N concurrent sessions) with uvicorn in a thread on
loopback. Its ready line is {"ready": true, "url": ...}; its requests are
{"id", "op": open|reset|step|close|schema, "session", ...} (bridge_runner.py runs the protocol).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import socket
import sys
import threading
import time
import urllib.request


def build_app(ref: str, sessions: int | None):
    """The app `module:app` names; with `sessions`, the same environment served by OpenEnv's own
    create_app allowing that many concurrent sessions (from the Environment, Action and Observation
    classes the app's module imports; OpenEnv refuses it for an environment that does not declare
    SUPPORTS_CONCURRENT_SESSIONS)."""
    module_name, _, attr = ref.partition(":")
    module = importlib.import_module(module_name)
    app = getattr(module, attr or "app")
    if not sessions:
        return app
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation

    def one(base):
        found = {v for v in vars(module).values() if isinstance(v, type) and issubclass(v, base) and v is not base}
        if len(found) != 1:
            raise RuntimeError(f"sessions needs {module_name} to import exactly one {base.__name__} subclass, "
                               f"found {sorted(c.__name__ for c in found) or 'none'}")
        return found.pop()

    return create_app(one(Environment), one(Action), one(Observation), max_concurrent_envs=sessions)


def serve_app(ref: str, sessions: int | None = None) -> str:
    """Run `module:app` under uvicorn in a thread on a free loopback port; its URL once /health answers."""
    import uvicorn

    app = build_app(ref, sessions)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
            return url
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{ref} did not answer {url}/health within 60 s")


def result(r) -> dict:
    return {"observation": r.observation, "reward": r.reward, "done": bool(r.done)}


async def handle(req: dict, url: str, sessions: dict) -> dict:
    from openenv.core import GenericEnvClient

    op, sid = req["op"], req.get("session")
    if op == "open":
        client = GenericEnvClient(base_url=url)
        await client.connect()
        sessions[sid] = client
        return {}
    if op == "reset":
        return result(await sessions[sid].reset(**req.get("kwargs", {})))
    if op == "step":
        return result(await sessions[sid].step(req["action"]))
    if op == "close":
        client = sessions.pop(sid, None)
        if client is not None:
            await client.close()
        return {}
    if op == "schema":
        return await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(url + "/schema", timeout=30)))
    raise ValueError(f"unknown op {op!r}")


def setup(argv: list[str]):
    """The ready line and the request handler (see bridge_runner.py)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--app")
    ap.add_argument("--path", action="append", default=[])
    ap.add_argument("--url")
    ap.add_argument("--sessions", type=int)
    args = ap.parse_args(argv)
    sys.path[:0] = args.path
    url = serve_app(args.app, args.sessions) if args.app else args.url.rstrip("/")
    sessions: dict = {}
    return {"ready": True, "url": url}, lambda req: handle(req, url, sessions)
