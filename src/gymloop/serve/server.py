"""A server put together: the model loaded into an engine behind a batcher, the store opened, the
app built (app.py), the promoted version followed, the fine-tuning worker started; `run` serves it
with uvicorn, `work` runs only the fine-tuning worker."""
from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import uvicorn
from safetensors.torch import load_file

from ..accounting.ledger import load_profiles
from ..accounting.rows import ServingLedger
from ..bases.registry import resolve_model
from ..engine.factory import EngineSpec, make_engine
from ..finetune.worker import JobWorker
from ..models.checkpoint import load_model
from ..models.parameters import count_parameters
from ..store import Store
from .app import create_app
from .batcher import Batcher
from .config import ServeConfig

log = logging.getLogger("gymloop.serve")


def build(cfg: ServeConfig):
    """(app, batcher, store) for a config: loads the model, opens the store, starts batching.
    (The caller sets torch's thread count: `gymloop serve` applies `cfg.threads`.)"""
    model_dir = resolve_model(cfg.model, progress=False)
    model, tok = load_model(model_dir)
    profiles = load_profiles()
    if cfg.cost_profile not in profiles:
        raise ValueError(f"cost_profile {cfg.cost_profile!r} is not a profile; known: {sorted(profiles)}")
    store = Store(cfg.db)
    serving = ServingLedger(store, profiles[cfg.cost_profile], count_parameters(model)[1])   # active ones
    engine = serving_engine(cfg, model, tok, model_dir)
    batcher = Batcher(engine, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000, on_batch=serving.add)
    try:
        follower = follow_promotions(store, batcher, cfg.poll_s, on_tick=serving.flush)
    except BaseException:
        batcher.close()
        engine.close()     # a vLLM server started for this one
        raise
    app = create_app(cfg, store, batcher, tok)
    svc = app.state.services
    svc.follower = follower
    svc.serving_ledger = serving      # flush() it to price the last seconds of serving
    if cfg.fine_tuning and cfg.job_worker:
        jobs = Path(cfg.jobs_dir) if cfg.jobs_dir else cfg.default_jobs_dir()
        svc.worker = JobWorker(store, jobs, svc.resolve_trainable, profiles[cfg.cost_profile],
                               cfg.cost_profile, checkpoint_every=cfg.checkpoint_every, chat=svc.grader_chat).start()
    return app, batcher, store


def serving_engine(cfg: ServeConfig, model, tok, model_dir: Path):
    """The served model's engine: gymloop's own on the loaded model, or a vLLM server."""
    return make_engine(EngineSpec(backend=cfg.engine_backend, dtype=cfg.engine_dtype, model_dir=str(model_dir),
                                  url=cfg.vllm_url, threads=cfg.threads, vllm=cfg.vllm.model_dump()), model, tok)


def shutdown(app) -> None:
    """Stop what `build` started: the fine-tuning worker (a running job stays `running` and is
    resumed by the next worker), the models served on demand, the batcher; price the last
    seconds of serving."""
    app.state.services.close()


class Follower:
    """The promotion follower's progress: how many times it has looked at the store, so a caller
    can wait until it has seen a change (`wait_checks`) instead of waiting a while."""

    def __init__(self) -> None:
        self.checks = 0
        self._changed = threading.Condition()

    def checked(self) -> None:
        with self._changed:
            self.checks += 1
            self._changed.notify_all()

    def wait_checks(self, n: int, timeout_s: float) -> bool:
        """Until the store has been looked at `n` times in all; False after `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(lambda: self.checks >= n, timeout_s)


def follow_promotions(store, batcher: Batcher, poll_s: float, on_tick=None) -> Follower:
    """Serve whatever the store says is promoted: check it, load the weights, swap between
    batches. The store is the single source of truth, so a promotion by `gymloop run` or a
    `gymloop rollback` in another process reaches this server without a restart: at once on
    PostgreSQL (the promotion is announced), within `poll_s` on SQLite."""
    follower = Follower()

    def check() -> None:
        row = store.versions.promoted()
        if row is not None and row["version"] != batcher.version:
            weights = load_file(str(Path(row["path"]) / "model.safetensors"))
            batcher.swap(weights, row["version"]).result(timeout=120)
        follower.checked()

    check()  # start on the promoted version, if any

    def loop() -> None:
        while not batcher.stopped:
            store.wait_for_promotion(poll_s)
            try:
                if on_tick is not None:
                    on_tick()
                check()
            except Exception as exc:  # noqa: BLE001 - keep serving the current version, say why
                log.warning("could not load the promoted version (still serving v%s): %s", batcher.version, exc)

    threading.Thread(target=loop, name="promotion-follower", daemon=True).start()
    return follower


def run(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000, announce=lambda line: None) -> None:
    """Serve until stopped; `announce(line)` once the model is loaded and the store open (a bad
    model or store is refused before anything says it is serving)."""
    app, _, _ = build(cfg)
    announce(f"serving {cfg.served_name()} on http://{host}:{port}/v1 (store: {cfg.db})")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        shutdown(app)


def work(cfg: ServeConfig) -> None:
    """`gymloop worker`: run the store's queued fine-tuning jobs, one at a time, until SIGTERM or
    SIGINT, without an HTTP server. The models, store and graders are those a `gymloop serve` of
    the same config resolves, so its jobs (started with `job_worker` off) run here as they would in
    its own thread; a job running when this stops stays `running` and the next worker resumes it."""
    app, _, _ = build(cfg.model_copy(update={"fine_tuning": True, "job_worker": True}))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        shutdown(app)
