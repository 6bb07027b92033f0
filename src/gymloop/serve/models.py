"""GET /v1/models: the served model, and the caller's own fine-tuned models (served on demand)."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from .config import ServeConfig
from .openapi import error_responses
from .services import Caller, Services, caller, services


async def models(svc: Services = Depends(services), who: Caller = Depends(caller)):
    data = [{"id": svc.name, "object": "model", "created": 0, "owned_by": "gymloop",
             "version": svc.batcher.version}]
    data += [{"id": m["id"], "object": "model", "created": int(m["created"]), "owned_by": who.tenant,
              "fine_tuning_job": m["job"]} for m in svc.store.jobs.fine_tuned_models(who.tenant)]
    return {"object": "list", "data": data}


def router(cfg: ServeConfig) -> APIRouter:
    r = APIRouter()
    r.add_api_route("/v1/models", models, methods=["GET"], responses=error_responses(401))
    return r
