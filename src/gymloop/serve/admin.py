"""What operators read, no key needed and no trace contents: the dashboard page and its JSON
(aggregates only), /healthz, /metrics (Prometheus)."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from .config import ServeConfig
from .dashboard import PAGE, dashboard_data
from .services import Services, services


async def dashboard():
    return HTMLResponse(PAGE)


async def dashboard_json(svc: Services = Depends(services)):
    # Aggregates only (counts, scores, costs), never trace contents: readable without a key.
    return await run_in_threadpool(dashboard_data, svc.store, svc.batcher, svc.metrics.by_status(), svc.name)


async def healthz(svc: Services = Depends(services)):
    engine = svc.batcher.engine
    return {"status": "ok", "model": svc.name, "model_version": svc.batcher.version,
            "job_worker": svc.worker is not None, "engine": engine.backend_name,
            "engine_restarts": getattr(engine, "restarts", 0)}


async def prom(svc: Services = Depends(services)):
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def router(cfg: ServeConfig) -> APIRouter:
    r = APIRouter()
    r.add_api_route("/", dashboard, methods=["GET"], response_class=HTMLResponse)
    r.add_api_route("/v1/dashboard", dashboard_json, methods=["GET"])
    r.add_api_route("/healthz", healthz, methods=["GET"])
    r.add_api_route("/metrics", prom, methods=["GET"], response_class=PlainTextResponse)
    return r
