"""The serving side: an OpenAI-compatible API with dynamic batching and hot weight swaps."""
from .batcher import Batcher
from .config import ServeConfig

__all__ = ["Batcher", "ServeConfig", "build", "run"]


def build(cfg: ServeConfig):
    """(app, batcher, store) for a config: loads the model, opens the store, starts batching."""
    import torch

    from ..checkpoint import load_model, resolve_model
    from ..engine import Engine
    from ..store import Store
    from .app import create_app

    torch.set_num_threads(cfg.threads)
    model, tok = load_model(resolve_model(cfg.model, progress=False))
    store = Store(cfg.db)
    engine = Engine(model, tok.pad_token_id, decode=tok.decode, version=0)
    batcher = Batcher(engine, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000)
    follow_promotions(store, batcher, cfg.poll_s)
    return create_app(cfg, store, batcher, tok), batcher, store


def follow_promotions(store, batcher: Batcher, poll_s: float) -> None:
    """Serve whatever the store says is promoted: poll it, load the weights, swap between
    batches. The store is the single source of truth, so a promotion by `gymloop run` or a
    `gymloop rollback` in another process reaches this server without a restart."""
    import threading
    import time

    from safetensors.torch import load_file

    def check() -> None:
        row = store.promoted()
        if row is None or row["version"] == batcher.version:
            return
        from pathlib import Path

        weights = load_file(str(Path(row["path"]) / "model.safetensors"))
        batcher.swap(weights, row["version"]).result(timeout=120)

    check()  # start on the promoted version, if any

    def loop() -> None:
        while not batcher.stopped:
            time.sleep(poll_s)
            try:
                check()
            except Exception as exc:  # noqa: BLE001 - keep serving the current version, say why
                print(f"gymloop serve: could not load the promoted version: {exc}", flush=True)

    threading.Thread(target=loop, name="promotion-follower", daemon=True).start()


def run(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn

    app, batcher, _ = build(cfg)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        batcher.close()
