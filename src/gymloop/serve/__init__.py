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
    version = (store.promoted() or {}).get("version", 0)
    engine = Engine(model, tok.pad_token_id, decode=tok.decode, version=version)
    batcher = Batcher(engine, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000)
    return create_app(cfg, store, batcher, tok), batcher, store


def run(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn

    app, batcher, _ = build(cfg)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        batcher.close()
