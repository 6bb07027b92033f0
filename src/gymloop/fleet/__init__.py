"""A serving fleet on Ray Serve: N replicas of `gymloop serve`'s app (each its own engine and
dynamic batcher) behind Ray Serve's proxy on one address, fine-tuning job workers as Ray actors,
and one store (PostgreSQL, or SQLite on one machine) they all write traces to and follow
promotions from. No load balancer of our own: Ray Serve routes, health-checks and restarts.

    config.py    FleetConfig: replicas, address, CPUs, the ServeConfig every replica runs
    replica.py   the Ray Serve deployment (one replica = one app) and its heartbeat in the store
    workers.py   the job-worker actor (what `gymloop worker` runs, restarted by Ray if it dies)
    control.py   up / status / down: the Ray head, an embedded PostgreSQL, the application
"""
from .config import FleetConfig

__all__ = ["FleetConfig"]
