"""The peer side of gymloop's JSON-lines bridge protocol (`runtimes.Channel` is gymloop's side),
run by a peer's runtime python, so it imports nothing of gymloop (stdlib only):

    python -P bridge_runner.py BRIDGE.py ARGS...

BRIDGE.py (openenv_bridge.py, verifiers_bridge.py) is loaded by path and defines
`setup(args) -> (ready, handle)`. The runner prints `ready` (a JSON object with "ready": true;
a setup that raises prints {"ready": false, "error"} and exits at once),
then answers each request line {"id", "op", ...} with {"id", "ok": true, **await handle(request)}
or {"id", "ok": false, "error"}; requests run concurrently on one event loop. What the peer's
code prints goes to stderr, off the protocol. When stdin closes (gymloop closed it, or died) the
process exits at once, whatever threads the peer's code left.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import threading
import traceback


def load(path: str):
    spec = importlib.util.spec_from_file_location("gymloop_bridge", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    out, lock = sys.stdout, threading.Lock()
    sys.stdout = sys.stderr                  # what the peer's code prints stays off the protocol
    try:
        ready, handle = load(sys.argv[1]).setup(sys.argv[2:])
    except BaseException as exc:  # noqa: BLE001 - said at once, as the ready line: a thread the
        # peer's import left running must not keep this process (and gymloop's wait) alive
        traceback.print_exc()
        out.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        os._exit(1)

    def reply(obj: dict) -> None:
        with lock:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def run(req: dict) -> None:
        try:
            reply({"id": req["id"], "ok": True, **await handle(req)})
        except Exception as exc:  # noqa: BLE001 - the peer's error, sent to gymloop
            reply({"id": req["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"})

    reply(ready)
    for line in sys.stdin:
        if line.strip():
            asyncio.run_coroutine_threadsafe(run(json.loads(line)), loop)
    os._exit(0)


if __name__ == "__main__":
    main()
