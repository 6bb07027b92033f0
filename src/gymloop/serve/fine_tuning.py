"""/v1/fine_tuning/jobs of the fine-tuning API, as the official `openai` client calls it: create,
estimate, list, retrieve, cancel, pause, resume, events, checkpoints and their downloads, and an
admin key's promote through the loop's gate. Every API key is a tenant: it sees only its own jobs
and models, and another tenant's ids are 404s. Shapes follow openai-python's types (never null
where the client expects a value: result_files, organization_id, seed, hyperparameters). Request
bodies' fields not set are None, so a route can tell "auto" and absent apart from a value."""
from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..bases.nano import nano_tokenizer
from ..config import EnvSpec
from ..envs.grader_types import Grader
from ..finetune.archive import FORMATS
from ..finetune.estimate import epoch_tokens
from ..finetune.formats import parse
from ..finetune.job import resolve
from ..loop.config import GateConfig, GateRun
from ..loop.gate import ArchitectureMismatch, promote_job_model
from ..models.checkpoint import parameter_count
from ..models.lora import LoraOptions
from .config import ServeConfig
from .graders import check_grader, grader_dict
from .http import APIError, found, limit_of, page
from .openapi import error_responses, json_body, json_int
from .services import Caller, Services, caller, services

STATUSES = ("validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused")


Auto = Literal["auto"]


class Hyperparameters(BaseModel):
    """A method's hyper-parameters: "auto" (or absent) or a value (methods.resolve)."""

    model_config = ConfigDict(extra="forbid")
    n_epochs: json_int(1, 1000) | Auto | None = None
    batch_size: json_int(1, 4096) | Auto | None = None
    learning_rate_multiplier: Annotated[float, Field(gt=0, le=1000)] | Auto | None = None
    beta: Annotated[float, Field(gt=0, le=100)] | Auto | None = Field(None, description="dpo: the KL weight.")
    sft_weight: Annotated[float, Field(ge=0, le=100)] | Auto | None = Field(
        None, description="dpo: weight of an NLL term on the preferred answer (RPO); auto: 1, 0: plain DPO.")
    length_normalize: bool | None = Field(None, description="dpo: log-ratios per token, not per answer.")
    reference_free: bool | None = Field(None, description="dpo: no reference model.")
    lora: LoraOptions | None = Field(None, description="Any method: train LoRA adapters (peft) instead of "
                                     "every weight.")
    compute_multiplier: Annotated[float, Field(gt=0, le=64)] | Auto | None = Field(
        None, description="reinforcement: samples per prompt = 8 x this (at least 2).")
    group_size: json_int(2, 256) | Auto | None = Field(None, description="reinforcement: samples per prompt "
                                                        "(overrides compute_multiplier).")
    max_new_tokens: json_int(1, 4096) | Auto | None = Field(None, description="reinforcement: most tokens per "
                                                             "sampled answer.")
    eval_interval: json_int(0, 100000) | Auto | None = Field(None, description="reinforcement: steps between "
                                                              "held-out evaluations (0: at the end only).")
    eval_samples: json_int(1, 100000) | Auto | None = Field(None, description="reinforcement: held-out prompts "
                                                             "evaluated (validation_file, else training prompts).")
    micro_batch_size: json_int(0, 4096) | Auto | None = Field(
        None, description="supervised and reinforcement: rows (sampled answers) per forward/backward pass, "
        "gradients summed over the parts (the same update in less memory; auto: 0, all at once, for models up to 1M parameters, else 4).")


class MethodOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hyperparameters: Hyperparameters | None = None


class ReinforcementOptions(MethodOptions):
    grader: Grader = Field(description="The grader that rewards each sampled answer.")


class MethodBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["supervised", "dpo", "reinforcement"]
    supervised: MethodOptions | None = None
    dpo: MethodOptions | None = None
    reinforcement: ReinforcementOptions | None = None


class PromoteRequest(BaseModel):
    """POST /v1/fine_tuning/jobs/{id}/promote (admin keys): the job's model through the loop's
    gate into the production slot. The suites are scored for production and candidate now."""

    model_config = ConfigDict(extra="forbid")
    env: EnvSpec = Field(description="The target suite: an environment and its options (as a loop's env).")
    suites: list[str] = Field(default_factory=list, max_length=16, description="Other held-out suites that must "
                              "not fall by more than epsilon.")
    eval_tasks: json_int(1, 100000) = Field(200, description="Held-out tasks per suite.")
    max_new_tokens: json_int(1, 4096) = Field(8, description="Most tokens per model turn in the evaluation.")
    gate: GateConfig = Field(default_factory=GateConfig, description="delta and epsilon of the gate.")


class JobCreate(BaseModel):
    """POST /v1/fine_tuning/jobs."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, description="A base model this server can train ('nano', ...), or an ft: "
                       "model or checkpoint id of yours (continued training).")
    training_file: str
    validation_file: str | None = None
    suffix: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    seed: json_int(0, 2**31 - 1) | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(None, max_length=16)
    method: MethodBody | None = None
    hyperparameters: Hyperparameters | None = Field(None, description="Legacy: the supervised method's "
                                                    "hyper-parameters.")
    integrations: list[dict] | None = Field(None, max_length=0, description="None are supported (metrics are "
                                            "the job's events and its results file).")


def _epoch_tokens(svc: Services, tenant: str, file_id: str, method: str, hp: dict) -> int:
    """Tokens one epoch of a file trains on (rendered by the nano chat template: an estimate for
    other tokenizers)."""
    return epoch_tokens(method, nano_tokenizer(), parse(svc.store.files.content(tenant, file_id)).rows, hp)


def _job(j: dict) -> dict:
    t = j["method"]["type"]
    public = j["hyperparameters"]["public"]
    options = {"hyperparameters": public, **({"grader": j["method"]["grader"]} if "grader" in j["method"] else {})}
    return {"id": j["id"], "object": "fine_tuning.job", "created_at": int(j["created"]), "model": j["model"],
            "status": j["status"], "training_file": j["training_file"], "validation_file": j["validation_file"],
            "fine_tuned_model": j["fine_tuned_model"],
            "finished_at": None if j["finished_at"] is None else int(j["finished_at"]),
            "estimated_finish": None, "trained_tokens": j["trained_tokens"],
            "result_files": j["result_files"] or [], "organization_id": j["tenant"], "seed": j["seed"],
            "hyperparameters": {k: public[k] for k in ("n_epochs", "batch_size", "learning_rate_multiplier")},
            "method": {"type": t, t: options}, "error": j["error"],
            "integrations": [], "metadata": j["metadata"] or None, "suffix": j["suffix"]}


def _event(e: dict) -> dict:
    return {"id": e["id"], "object": "fine_tuning.job.event", "created_at": int(e["created"]), "level": e["level"],
            "message": e["message"], "type": e["type"], "data": e["data"]}


def _checkpoint(c: dict) -> dict:
    return {"id": c["id"], "object": "fine_tuning.job.checkpoint", "created_at": int(c["created"]),
            "fine_tuned_model_checkpoint": c["model_id"], "fine_tuning_job_id": c["job_id"],
            "step_number": c["step"], "metrics": {k: v for k, v in c["metrics"].items() if k != "total_steps"}}


def _training_files(svc: Services, tenant: str, body: JobCreate, method: str) -> int:
    """Check the files a job names (theirs, processed, of the method's kind); the training file's examples."""
    n = 0
    for param in ("training_file", "validation_file"):
        fid = getattr(body, param)
        if fid is None:
            continue
        f = found(svc.store.files.get(tenant, fid), f"File object: {fid}", param)
        # the request is well-formed; the file it names is not fit for it (409, as OpenAI's state errors)
        if f["status"] != "processed":
            raise APIError(409, f"file {fid} is not a valid training file: {f['status_details']}", param=param)
        if f["kind"] != method:
            raise APIError(409, f"file {fid} holds {f['kind']} examples; method {method} needs {method} ones",
                           param=param)
        if param == "training_file":
            n = f["examples"]
    return n


def check_create(svc: Services, tenant: str, body: JobCreate) -> tuple[dict, dict, int]:
    """(method spec, hyper-parameters resolved and public, training examples) of a job request."""
    method = body.method.type if body.method else "supervised"
    options = getattr(body.method, method) if body.method else None
    given = {**(body.hyperparameters.model_dump(exclude_none=True) if body.hyperparameters else {}),
             **(options.hyperparameters.model_dump(exclude_none=True) if options and options.hyperparameters
                else {})}
    start = svc.resolve_trainable(tenant, body.model)
    if start is None:
        raise APIError(404, f"model {body.model!r} is not a base model this server trains or one of your "
                       "fine-tuned models", param="model")
    n = _training_files(svc, tenant, body, method)
    try:
        hp = resolve(method, given, n, parameter_count(start))       # "auto" fits the model's size
    except ValueError as exc:       # the schema bounds each value; this is a combination
        raise APIError(409, f"hyperparameters: {exc}", param="hyperparameters") from None
    spec = {"type": method}
    if method == "reinforcement":
        if options is None:
            raise APIError(400, "method.reinforcement (with its grader) is required", param="method.reinforcement")
        check_grader(svc, tenant, options.grader, "method.reinforcement.grader")
        spec["grader"] = grader_dict(options.grader)        # stored as JSON; the job's environment types it again
    return spec, {"resolved": hp.__dict__, "public": hp.public(method)}, n


async def create_job(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    body: JobCreate = await svc.body(request, JobCreate)
    spec, hyper, _ = await run_in_threadpool(check_create, svc, who.tenant, body)
    job = svc.store.jobs.add(tenant=who.tenant, model=body.model, training_file=body.training_file,
                             validation_file=body.validation_file, suffix=body.suffix,
                             seed=body.seed if body.seed is not None else int(time.time()) % 2**31,
                             metadata=body.metadata or {}, method=spec, hyperparameters=hyper)
    return _job(job)


async def estimate(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    """Trained tokens of a job before it runs (its examples x epochs), and its cost at the
    throughput this server's trainer measured, when it has finished a job."""
    body: JobCreate = await svc.body(request, JobCreate)
    spec, hyper, _ = await run_in_threadpool(check_create, svc, who.tenant, body)
    method = spec["type"]
    tokens = await run_in_threadpool(_epoch_tokens, svc, who.tenant, body.training_file, method, hyper["resolved"])
    trained = tokens * hyper["resolved"]["n_epochs"]
    rate = svc.store.ledger.fine_tuning_rate()
    out = {"object": "fine_tuning.job.estimate", "trained_tokens": trained, "method": method,
           "hyperparameters": hyper["public"]}
    if rate is not None:
        out.update(estimated_seconds=trained / rate["tokens_per_second"],
                   estimated_dollars=trained * rate["dollars_per_token"],
                   basis=f"{rate['jobs']} finished jobs on this server")
    return out


async def list_jobs(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    meta = {k[9:-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")}
    rows, more = svc.store.jobs.list(who.tenant, after=request.query_params.get("after"), limit=limit_of(request),
                                     metadata=meta or None)
    return page([_job(j) for j in rows], more)


def own_job(svc: Services, tenant: str, job_id: str) -> dict:
    return found(svc.store.jobs.get(tenant, job_id), f"fine-tuning job: {job_id}", "fine_tuning_job_id")


async def get_job(job_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    return _job(own_job(svc, who.tenant, job_id))


# action -> (statuses it applies to, new status, event message)
ACTIONS = {"cancel": (("validating_files", "queued", "running", "paused"), "cancelled", "Job cancelled"),
           "pause": (("queued", "running"), "paused", "Job paused"),
           "resume": (("paused",), "queued", "Job resumed")}


def _act(action: str):
    allowed, new, message = ACTIONS[action]

    async def route(job_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
        own_job(svc, who.tenant, job_id)
        extra = {"finished_at": time.time()} if new == "cancelled" else {}
        if not svc.store.jobs.update(job_id, status=new, when_status=allowed,
                                     event=("info", message, "message", {}), **extra):
            raise APIError(409, f"cannot {action} a job that is {svc.store.jobs.get(who.tenant, job_id)['status']}",
                           param="fine_tuning_job_id")
        return _job(own_job(svc, who.tenant, job_id))
    return route




def _job_list(what: str, shape):
    """A job's events or checkpoints, newest first, paged with after=<id>."""
    async def route(job_id: str, request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
        own_job(svc, who.tenant, job_id)
        rows, more = getattr(svc.store.jobs, what)(job_id, after=request.query_params.get("after"), limit=limit_of(request))
        return page([shape(r) for r in rows], more)
    return route




async def promote(job_id: str, request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    """An admin key's request: the job's fine-tuned model replaces the production model (the
    one this server and `gymloop run` serve and train from) if the loop's gate passes it."""
    if not who.admin:
        raise APIError(403, "promoting into production needs an admin key (gymloop serve --admin-key)",
                       "permission_error")
    job = own_job(svc, who.tenant, job_id)
    if job["status"] != "succeeded":
        raise APIError(409, f"job {job_id} is {job['status']}; only a succeeded job's model can be promoted",
                       param="fine_tuning_job_id")
    body: PromoteRequest = await svc.body(request, PromoteRequest)
    cfg = GateRun(env=body.env, suites=body.suites, gate=body.gate,
                  eval={"tasks": body.eval_tasks, "every": 0, "max_new_tokens": body.max_new_tokens})
    try:
        out = await run_in_threadpool(promote_job_model, svc.store, job, cfg, svc.production_dir())
    except ArchitectureMismatch as exc:
        raise APIError(409, str(exc), param="fine_tuning_job_id") from None
    except ValueError as exc:        # an environment that cannot be built, too few held-out tasks
        raise APIError(400, str(exc), param="env") from None
    return {"object": "fine_tuning.job.promotion", "fine_tuning_job_id": job["id"],
            "fine_tuned_model": job["fine_tuned_model"], **out}


async def checkpoint_content(job_id: str, checkpoint_id: str, request: Request, svc: Services = Depends(services),
                             who: Caller = Depends(caller)):
    """A checkpoint to load with Hugging Face: format=merged, the model (LoRA folded in), for
    AutoModelForCausalLM.from_pretrained; format=adapter, a LoRA job's adapter, for
    PeftModel.from_pretrained(base, dir)."""
    own_job(svc, who.tenant, job_id)
    ckpt = found(svc.store.jobs.get_checkpoint(job_id, checkpoint_id), f"checkpoint: {checkpoint_id}", "checkpoint_id")
    format = request.query_params.get("format", "merged")
    if format not in FORMATS:
        raise APIError(400, f"format must be one of {', '.join(FORMATS)} (got {format!r})", param="format")
    name = ckpt["model_id"].replace(":", "_") + ("-adapter" if format == "adapter" else "")
    return await run_in_threadpool(_archive_response, ckpt, format, name)


def _archive_response(ckpt: dict, fmt: str, name: str) -> Response:
    """The checkpoint as a .tar.gz, written to a temporary file and streamed (a model may not
    fit in memory twice); the file is removed once sent."""
    import os
    import tempfile
    from pathlib import Path

    from starlette.background import BackgroundTask
    from starlette.responses import FileResponse

    from ..finetune.archive import write_archive

    fd, tmp = tempfile.mkstemp(suffix=".tar.gz")
    os.close(fd)
    try:
        write_archive(Path(ckpt["path"]), fmt, Path(tmp), name)
    except ValueError as exc:
        os.unlink(tmp)
        raise APIError(409, str(exc), param="format") from None
    except BaseException:
        os.unlink(tmp)
        raise
    return FileResponse(tmp, media_type="application/gzip", filename=f"{name}.tar.gz",
                        background=BackgroundTask(os.unlink, tmp))


def router(cfg: ServeConfig) -> APIRouter:
    r = APIRouter()
    r.add_api_route("/v1/fine_tuning/jobs", create_job, methods=["POST"], openapi_extra=json_body(JobCreate),
                    responses=error_responses(400, 401, 404, 409, 413))
    r.add_api_route("/v1/fine_tuning/jobs/estimate", estimate, methods=["POST"], openapi_extra=json_body(JobCreate),
                    responses=error_responses(400, 401, 404, 409, 413))
    r.add_api_route("/v1/fine_tuning/jobs", list_jobs, methods=["GET"], responses=error_responses(400, 401))
    r.add_api_route("/v1/fine_tuning/jobs/{job_id}", get_job, methods=["GET"], responses=error_responses(401, 404))
    for action in ACTIONS:
        r.add_api_route(f"/v1/fine_tuning/jobs/{{job_id}}/{action}", _act(action), methods=["POST"],
                        name=f"{action}_job", responses=error_responses(401, 404, 409))
    for what, shape in (("events", _event), ("checkpoints", _checkpoint)):
        r.add_api_route(f"/v1/fine_tuning/jobs/{{job_id}}/{what}", _job_list(what, shape), methods=["GET"],
                        name=f"job_{what}", responses=error_responses(400, 401, 404))
    r.add_api_route("/v1/fine_tuning/jobs/{job_id}/promote", promote, methods=["POST"],
                    openapi_extra=json_body(PromoteRequest), responses=error_responses(400, 401, 403, 404, 409, 413))
    r.add_api_route("/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}/content", checkpoint_content,
                    methods=["GET"], responses={
                        200: {"description": "the checkpoint as a .tar.gz of one directory",
                              "content": {"application/gzip": {}}},
                        **error_responses(400, 401, 404, 409)}, openapi_extra={"parameters": [
                            {"name": "format", "in": "query", "required": False,
                             "schema": {"type": "string", "enum": list(FORMATS), "default": "merged"}}]})
    return r
