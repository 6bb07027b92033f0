"""`gymloop serve`'s FastAPI app: one router per API over one Services object (services.py) and
the shared serving core (core.py), every answer in OpenAI's shapes, errors in OpenAI's error shape.
Each API module holds its request/response schemas and its routes, as `router(cfg)`.

    admin.py        /, /v1/dashboard, /healthz, /metrics
    models.py       /v1/models
    chat.py         /v1/chat/completions
    completions.py  /v1/completions (raw text in, text and token log-probs out)
    responses.py    /v1/responses (the Responses API: input items, previous_response_id)
    feedback.py     /v1/feedback
    files.py        /v1/files                            (the fine-tuning API, when enabled)
    graders.py      /v1/fine_tuning/alpha/graders
    fine_tuning.py  /v1/fine_tuning/jobs
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute

from ..models.chat import ChatTokenizer
from ..store import Store
from . import admin, chat, completions, feedback, files, fine_tuning, graders, models, responses
from .batcher import Batcher
from .config import ServeConfig
from .http import APIError, error_response
from .metrics import InFlight
from .services import Services


SERVING_APIS = (admin, models, chat, completions, responses, feedback)
FINE_TUNING_APIS = (files, graders, fine_tuning)


def create_app(cfg: ServeConfig, store: Store, batcher: Batcher, tok: ChatTokenizer) -> FastAPI:
    app = FastAPI(title="gymloop", version="0.1.0")
    app.state.services = svc = Services.of(cfg, store, batcher, tok, lambda path: _load_for_serving(path, cfg))

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        svc.metrics.count(exc.status)
        return error_response(exc.status, exc.message, exc.kind, exc.param, exc.code)

    @app.middleware("http")
    async def _allow(request: Request, call_next):
        # a 405 names every method of the path (Starlette names only the first route's)
        response = await call_next(request)
        if response.status_code == 405:
            path = request.url.path
            matching = [r for r in app.routes if isinstance(r, APIRoute) and r.path_regex.match(path)]
            # a path written out (/v1/fine_tuning/jobs/estimate) is that resource, not a template's id
            static = [r for r in matching if "{" not in r.path]
            response.headers["allow"] = ", ".join(sorted({m for r in static or matching for m in r.methods}))
        return response

    app.add_middleware(InFlight, metrics=svc.metrics)
    for api in SERVING_APIS + (FINE_TUNING_APIS if cfg.fine_tuning else ()):
        app.include_router(api.router(cfg))
    return app


def _load_for_serving(path: str, cfg: ServeConfig) -> tuple[Batcher, ChatTokenizer, int]:
    """A fine-tuned model's own engine and batcher (it may have another tokenizer than the base)."""
    from ..engine.factory import EngineSpec, make_engine
    from ..models.checkpoint import load_model

    model, tok = load_model(path)
    # gymloop's own engine: a fine-tuned model served on demand is loaded in process
    engine = make_engine(EngineSpec(dtype=cfg.engine_dtype), model, tok)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return Batcher(engine, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000), tok, size
