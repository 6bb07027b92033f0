"""The serving side: an OpenAI-compatible API with dynamic batching and hot weight swaps.

    server.py   a server put together (engine, batcher, store, app), run, stopped
    app.py      the FastAPI app: one router per API module over the shared serving core (core.py)
"""
from .batcher import Batcher
from .config import ServeConfig
from .server import build, follow_promotions, run, shutdown, work

__all__ = ["Batcher", "ServeConfig", "build", "follow_promotions", "run", "shutdown", "work"]
