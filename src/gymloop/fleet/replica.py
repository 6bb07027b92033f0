"""One fleet replica: the app `gymloop serve` builds (its own engine, batcher and promotion
follower; no job worker), as a Ray Serve deployment, writing a heartbeat to the store.

Ray Serve's proxy routes each request to a replica, health-checks replicas (`check_health`) and
replaces one that dies. A promotion reaches every replica through the store (LISTEN/NOTIFY on
PostgreSQL): each swaps weights between two engine batches, so no request fails or mixes
versions, and its heartbeat records when it started answering with the new version."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time

log = logging.getLogger("gymloop.fleet")


class Heartbeat:
    """Writes the replica's row (`store.replicas`) every `every_s`, and at once when the served
    version changes, with the time it changed (measured by looking every 0.1 s)."""

    def __init__(self, store, services, fleet: str, replica_id: str, every_s: float) -> None:
        self.store, self.svc, self.every_s = store, services, every_s
        now = time.time()
        self.row = {"id": replica_id, "fleet": fleet, "host": socket.gethostname(), "pid": os.getpid(),
                    "started": now, "seen": now, "version": services.batcher.version, "version_since": now,
                    "in_flight": 0, "answered": 0}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="replica-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._write()
        self.thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def _write(self) -> None:
        svc = self.svc
        self.row.update(in_flight=svc.metrics.in_flight, answered=svc.batcher.batched_requests)
        self.store.replicas.beat(self.row)

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.1):
            version = self.svc.batcher.version
            changed = version != self.row["version"]
            if changed:
                self.row.update(version=version, version_since=time.time())
            if changed or time.monotonic() - last >= self.every_s:
                try:
                    self._write()
                    last = time.monotonic()
                except Exception as exc:  # noqa: BLE001 - a store hiccup must not stop serving; say it
                    log.warning("replica heartbeat not written: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        try:
            self.store.replicas.remove(self.row["id"])
        except Exception as exc:  # noqa: BLE001 - stopping anyway
            log.warning("replica row not removed: %s", exc)


class Replica:
    """The deployment's class (Ray Serve wraps it with `serve.ingress()`): builds the app in the
    replica's process and hands it to Ray Serve as its ASGI app."""

    def __init__(self, serve_config: str, fleet: str, heartbeat_s: float) -> None:
        import torch
        from ray import serve

        from ..serve import ServeConfig, build

        cfg = ServeConfig.model_validate_json(serve_config)
        torch.set_num_threads(cfg.threads)
        # not `self.app`: Ray Serve's wrapper owns that name
        self.server, self.batcher, self.store = build(cfg)
        try:
            replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside Ray Serve (tests of the class itself)
            replica_id = f"{socket.gethostname()}-{os.getpid()}"
        self.heartbeat = Heartbeat(self.store, self.server.state.services, fleet, replica_id, heartbeat_s).start()

    def __serve_build_asgi_app__(self):
        return self.server

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose batcher or heartbeat stopped is replaced."""
        if self.batcher.stopped:
            raise RuntimeError("the batcher stopped")
        if not self.heartbeat.alive:
            raise RuntimeError("the heartbeat thread stopped")

    def __del__(self) -> None:
        from ..serve import shutdown

        if hasattr(self, "heartbeat"):
            self.heartbeat.stop()
        if hasattr(self, "server"):
            shutdown(self.server)


def application(cfg):
    """The Ray Serve application of a FleetConfig (`serve.run` deploys it)."""
    from ray import serve

    deployment = serve.deployment(
        serve.ingress()(Replica), name="openai", num_replicas=cfg.replicas,
        ray_actor_options={"num_cpus": cfg.replica_cpus}, max_ongoing_requests=cfg.max_ongoing_requests,
        health_check_period_s=2.0, health_check_timeout_s=30.0, graceful_shutdown_timeout_s=30.0)
    return deployment.bind(cfg.serve.model_dump_json(), cfg.name, cfg.heartbeat_s)
