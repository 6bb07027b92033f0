"""POST /v1/feedback: a verdict on an answer (a reward in [0, 1] or a label), attached to its
trace, with the task it answered when the caller knows it (so the loop can rebuild a failure
and train on it); or a reward on a whole session of an agent program (`session_id`: the
x-gymloop-session its calls carried), whose task the loop re-runs the program on."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..store import StoreError
from .config import ServeConfig
from .http import APIError
from .openapi import error_responses, json_body, json_int
from .services import Caller, Services, caller, services


class TaskRef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    env: str
    version: json_int() | None = None
    task_id: str | None = None


class FeedbackRequest(BaseModel):
    # "a reward or a label" stated in the schema too, so /openapi.json documents what is accepted
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"required": ["trace_id", "reward"], "properties": {"reward": {"type": "number"}}},
        {"required": ["trace_id", "label"], "properties": {"label": {"type": "string"}}},
        {"required": ["session_id", "reward"], "properties": {"reward": {"type": "number"}}}]})
    trace_id: str | None = Field(None, description="The answer judged (or give session_id).")
    session_id: str | None = Field(None, description="An agent program's session judged whole (the "
                                   "x-gymloop-session its calls carried): needs a reward.")
    reward: float | None = Field(None, ge=0, le=1)
    label: str | None = Field(None, max_length=200)
    task: TaskRef | None = None


async def feedback(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    fb: FeedbackRequest = await svc.body(request, FeedbackRequest)
    if (fb.trace_id is None) == (fb.session_id is None):
        raise APIError(400, "feedback names one trace_id or one session_id", param="trace_id")
    if fb.session_id is not None:
        if fb.reward is None or fb.label is not None or fb.task is not None:
            raise APIError(400, "session feedback is a reward (0..1) alone", param="reward")
        try:
            fid = await run_in_threadpool(svc.store.sessions.add_feedback, fb.session_id, fb.reward)
        except StoreError as exc:
            raise APIError.of(exc, param="session_id") from None
        svc.metrics.count(200)
        return {"id": fid, "session_id": fb.session_id}
    if fb.reward is None and fb.label is None:
        raise APIError(400, "feedback needs a reward (0..1) or a label", param="reward")
    try:
        fid = await run_in_threadpool(
            svc.store.traces.add_feedback, fb.trace_id, reward=fb.reward, label=fb.label,
            env=fb.task.env if fb.task else None, env_version=fb.task.version if fb.task else None,
            task_id=fb.task.task_id if fb.task else None)
    except StoreError as exc:
        raise APIError.of(exc, param="trace_id") from None
    svc.metrics.count(200)
    return {"id": fid, "trace_id": fb.trace_id}


def router(cfg: ServeConfig) -> APIRouter:
    r = APIRouter()
    r.add_api_route("/v1/feedback", feedback, methods=["POST"], openapi_extra=json_body(FeedbackRequest),
                    responses=error_responses(400, 401, 404, 413))
    return r
