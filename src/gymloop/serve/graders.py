"""/v1/fine_tuning/alpha/graders: run a grader on a sample, or validate one. A grader is typed by
`type` (envs/grader_types.py) and run by envs/graders.py, the same code a reinforcement job's
rewards come from."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..envs.grader_types import Grader
from ..envs.graders import GraderError, UnknownModel
from .config import ServeConfig
from .http import APIError
from .openapi import error_responses, json_body
from .services import Caller, Services, caller, services


class GraderValidate(BaseModel):
    """POST /v1/fine_tuning/alpha/graders/validate."""

    model_config = ConfigDict(extra="forbid")
    grader: Grader = Field(description="A grader object.")


class GraderRun(BaseModel):
    """POST /v1/fine_tuning/alpha/graders/run."""

    model_config = ConfigDict(extra="forbid")
    grader: Grader = Field(description="A grader object.")
    model_sample: str = Field(description="The model output the grader scores ({{sample.output_text}}).")
    item: dict | None = Field(None, description="The data item ({{item.<field>}}).")


def grader_dict(g: BaseModel) -> dict:
    return g.model_dump(exclude_none=True)


def check_grader(svc: Services, tenant: str, grader: Grader, param: str) -> None:
    from ..envs.graders import validate as check

    try:
        check(grader, served=lambda model: svc.servable(tenant, model))
    except UnknownModel as exc:
        raise APIError(404, f"invalid grader: {exc}", param=param, code="model_not_found") from None
    except GraderError as exc:
        raise APIError(400, f"invalid grader: {exc}", param=param) from None


async def run_grader(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    """The reward a grader gives a sample; a grader that fails says so in metadata.errors."""
    from ..envs.graders import run

    body: GraderRun = await svc.body(request, GraderRun)
    return await run_in_threadpool(run, body.grader, body.model_sample, body.item or {},
                                   svc.grader_runtime(who.tenant))


async def validate_grader(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    """The grader back when it is well-formed (every part checked, python parsed, not run);
    a 400 naming what is wrong otherwise."""
    body: GraderValidate = await svc.body(request, GraderValidate)
    await run_in_threadpool(check_grader, svc, who.tenant, body.grader, "grader")
    return {"grader": grader_dict(body.grader)}


def router(cfg: ServeConfig) -> APIRouter:
    r = APIRouter()
    r.add_api_route("/v1/fine_tuning/alpha/graders/run", run_grader, methods=["POST"],
                    openapi_extra=json_body(GraderRun), responses=error_responses(400, 401, 413))
    r.add_api_route("/v1/fine_tuning/alpha/graders/validate", validate_grader, methods=["POST"],
                    openapi_extra=json_body(GraderValidate), responses=error_responses(400, 401, 404, 413))
    return r
