"""`gymloop serve`'s FastAPI app: routers over one Services object (services.py), every answer
in OpenAI's shapes, errors in OpenAI's error shape.

    admin.py        /, /v1/dashboard, /healthz, /metrics
    chat.py         /v1/models, /v1/chat/completions, /v1/feedback
    completions.py  /v1/completions (raw text in, text and token log-probs out)
    responses.py    /v1/responses (the Responses API: input items, previous_response_id)
    fine_tuning.py  /v1/files, /v1/fine_tuning/jobs, /v1/fine_tuning/alpha/graders
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute

from ..models.chat import ChatTokenizer
from ..store import Store
from . import admin, fine_tuning
from .batcher import Batcher
from .chat import chat_router
from .completions import completions_router
from .responses import responses_router
from .config import ServeConfig
from .http import APIError, error_response
from .metrics import InFlight
from .services import Services


def create_app(cfg: ServeConfig, store: Store, batcher: Batcher, tok: ChatTokenizer) -> FastAPI:
    app = FastAPI(title="gymloop", version="0.1.0")
    app.state.services = svc = Services.of(cfg, store, batcher, tok, lambda path: _load_for_serving(path, cfg))

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        svc.metrics.count(exc.status)
        return error_response(exc.status, exc.message, exc.kind, exc.param)

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
    app.include_router(admin.router)
    app.include_router(chat_router(cfg))
    app.include_router(completions_router(cfg))
    app.include_router(responses_router(cfg))
    if cfg.fine_tuning:
        for router in (fine_tuning.files, fine_tuning.graders, fine_tuning.jobs):
            app.include_router(router)
    return app


def _load_for_serving(path: str, cfg: ServeConfig) -> tuple[Batcher, ChatTokenizer, int]:
    """A fine-tuned model's own engine and batcher (it may have another tokenizer than the base)."""
    from ..engine import Engine
    from ..models.checkpoint import load_model

    model, tok = load_model(path)
    engine = Engine(model, tok.pad_token_id, decode=tok.decode, version=0, dtype=cfg.engine_dtype)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return Batcher(engine, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000), tok, size
