"""Serves a NeMo Gym resources server standalone (no head server, no `ng_run`), run by NeMo Gym's
runtime python (its own venv), so it imports nothing of gymloop:

    python -P nemo_gym_server.py module:Class

The class is built with its own config class, as NeMo Gym's own tests build it, and its
`setup_webserver()` app (the server's code, unchanged) runs under uvicorn on loopback. It prints
{"ready": true, "url": ..., "data": <the example data beside its module, if any>} and serves until
its stdin closes.
"""
from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def build(ref: str):
    from nemo_gym.server_utils import BaseServerConfig, ServerClient
    from omegaconf import DictConfig

    module_name, _, cls_name = ref.partition(":")
    module = importlib.import_module(module_name)
    cls = getattr(module, cls_name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = cls.model_fields["config"].annotation(host="127.0.0.1", port=port, entrypoint="", name=cls_name)
    # a resources server that calls no other server needs no head server: a client that points nowhere
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=0), global_config_dict=DictConfig({}))
    server = cls(config=config, server_client=client)
    data = Path(module.__file__).parent / "data" / "example.jsonl"
    return server.setup_webserver(), port, (str(data) if data.exists() else None)


def main() -> None:
    import uvicorn

    try:
        app, port, data = build(sys.argv[1])
    except BaseException as exc:  # noqa: BLE001 - said at once: threads its import started must not keep this alive
        import traceback

        traceback.print_exc()
        print(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        os._exit(1)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(url + "/seed_session", data=b"{}",
                                                          headers={"content-type": "application/json"}), timeout=1)
            break
        except urllib.error.HTTPError:
            break                       # an answer, any status (a 422 for a seed that takes fields): it is up
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{sys.argv[1]} did not answer {url}/seed_session within 60 s") from None
            time.sleep(0.05)
    print(json.dumps({"ready": True, "url": url, "data": data}), flush=True)
    sys.stdin.read()                    # until gymloop closes it (or dies)
    os._exit(0)                         # whatever threads the server left


if __name__ == "__main__":
    main()
