"""The fine-tuning API on `gymloop serve`, as the official `openai` client calls it:
/v1/files, /v1/fine_tuning/jobs (create, list, retrieve, cancel, pause, resume, events,
checkpoints and their downloads, estimate, and an admin key's promote) and
/v1/fine_tuning/alpha/graders (run, validate), as three routers (files, graders, jobs) over the
app's Services. Request bodies: fine_tuning_bodies.py. Every API key is a tenant: it sees only its own files, jobs and models,
and another tenant's ids are 404s. Shapes follow openai-python's types (never null where the
client expects a value: result_files, organization_id, seed, hyperparameters).
"""
from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from .http import APIError, found, limit_of
from .openapi import error_responses, json_body
from .services import Caller, Services, caller, services
from ..store import Store
from ..envs.grader_types import Grader
from ..envs.graders import GraderError
from ..finetune.archive import FORMATS
from ..finetune.formats import FormatError, parse
from ..finetune.job import BASE_LR, resolve
from ..models.checkpoint import parameter_count
from .fine_tuning_bodies import GraderRun, GraderValidate, JobCreate, PromoteRequest, grader_dict

UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["fine-tune"]}}}}}}}
STATUSES = ("validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused")
MAX_FILE_BYTES = 512 << 20


def _file(f: dict) -> dict:
    # files never expire here: no expires_at (the schema has no null for it); status_details only
    # when there is one (why a file failed validation)
    out = {"id": f["id"], "object": "file", "bytes": f["bytes"], "created_at": int(f["created"]),
           "filename": f["filename"], "purpose": f["purpose"], "status": f["status"]}
    if f["status_details"] is not None:
        out["status_details"] = f["status_details"]
    return out


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


def _page(items: list[dict], more: bool) -> dict:
    """A list page; first_id / last_id name its ends (null when empty), as OpenAI's lists do."""
    return {"object": "list", "data": items, "has_more": more,
            "first_id": items[0]["id"] if items else None, "last_id": items[-1]["id"] if items else None}


# --- files -------------------------------------------------------------------------------------
files = APIRouter()


@files.post("/v1/files", openapi_extra=UPLOAD_BODY, responses=error_responses(400, 401, 413))
async def create_file(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    try:
        form = await request.form(max_part_size=MAX_FILE_BYTES)
    except Exception as exc:  # noqa: BLE001 - Starlette's multipart errors, in OpenAI's error shape
        raise APIError(400, f"the body is not a valid multipart form: {getattr(exc, 'detail', exc)}") from None
    upload, purpose = form.get("file"), form.get("purpose")
    if purpose not in ("fine-tune",):
        raise APIError(400, f"purpose must be 'fine-tune' (got {purpose!r})", param="purpose")
    if upload is None or isinstance(upload, str):
        raise APIError(400, "a multipart 'file' field is required", param="file")
    content = await upload.read()
    try:
        parsed = parse(content)
        status, details, kind, examples = "processed", None, parsed.kind, len(parsed.rows)
    except FormatError as exc:
        # kept, and said: the file is listed with the first bad line, nothing is lost
        status, details, kind, examples = "error", str(exc), None, None
    f = await run_in_threadpool(svc.store.files.add, tenant=who.tenant, filename=upload.filename or "upload.jsonl",
                                purpose=purpose, content=content, status=status, status_details=details,
                                kind=kind, examples=examples)
    return _file(f)


@files.get("/v1/files", responses=error_responses(400, 401))
async def list_files(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    rows, more = svc.store.files.list(who.tenant, after=request.query_params.get("after"), limit=limit_of(request),
                                      purpose=request.query_params.get("purpose"))
    return _page([_file(f) for f in rows], more)


def own_file(svc: Services, tenant: str, file_id: str) -> dict:
    return found(svc.store.files.get(tenant, file_id), f"File object: {file_id}", "id")


@files.get("/v1/files/{file_id}", responses=error_responses(401, 404))
async def get_file(file_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    return _file(own_file(svc, who.tenant, file_id))


@files.get("/v1/files/{file_id}/content", responses={
    200: {"description": "the file as uploaded", "content": {"application/octet-stream": {}}},
    **error_responses(401, 404)})
async def file_content(file_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    own_file(svc, who.tenant, file_id)
    return Response(svc.store.files.content(who.tenant, file_id), media_type="application/octet-stream")


@files.delete("/v1/files/{file_id}", responses=error_responses(401, 404))
async def delete_file(file_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    own_file(svc, who.tenant, file_id)
    svc.store.files.delete(who.tenant, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


# --- graders ---------------------------------------------------------------------------------
graders = APIRouter()


def check_grader(svc: Services, tenant: str, grader: Grader, param: str) -> None:
    from ..envs.graders import validate as check

    try:
        check(grader, served=lambda model: svc.servable(tenant, model))
    except GraderError as exc:
        raise APIError(400, f"invalid grader: {exc}", param=param) from None


@graders.post("/v1/fine_tuning/alpha/graders/run", openapi_extra=json_body(GraderRun),
              responses=error_responses(400, 401, 413))
async def run_grader(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    """The reward a grader gives a sample; a grader that fails says so in metadata.errors."""
    from ..envs.graders import run

    body: GraderRun = await svc.body(request, GraderRun)
    return await run_in_threadpool(run, body.grader, body.model_sample, body.item or {},
                                   svc.grader_runtime(who.tenant))


@graders.post("/v1/fine_tuning/alpha/graders/validate", openapi_extra=json_body(GraderValidate),
              responses=error_responses(400, 401, 413))
async def validate_grader(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    """The grader back when it is well-formed (every part checked, python parsed, not run);
    a 400 naming what is wrong otherwise."""
    body: GraderValidate = await svc.body(request, GraderValidate)
    await run_in_threadpool(check_grader, svc, who.tenant, body.grader, "grader")
    return {"grader": grader_dict(body.grader)}


# --- jobs ------------------------------------------------------------------------------------
jobs = APIRouter()


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


@jobs.post("/v1/fine_tuning/jobs", openapi_extra=json_body(JobCreate),
           responses=error_responses(400, 401, 404, 409, 413))
async def create_job(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    body: JobCreate = await svc.body(request, JobCreate)
    spec, hyper, _ = await run_in_threadpool(check_create, svc, who.tenant, body)
    job = svc.store.jobs.add(tenant=who.tenant, model=body.model, training_file=body.training_file,
                             validation_file=body.validation_file, suffix=body.suffix,
                             seed=body.seed if body.seed is not None else int(time.time()) % 2**31,
                             metadata=body.metadata or {}, method=spec, hyperparameters=hyper)
    return _job(job)


@jobs.post("/v1/fine_tuning/jobs/estimate", openapi_extra=json_body(JobCreate),
           responses=error_responses(400, 401, 404, 409, 413))
async def estimate(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    """Trained tokens of a job before it runs (its examples x epochs), and its cost at the
    throughput this server's trainer measured, when it has finished a job."""
    body: JobCreate = await svc.body(request, JobCreate)
    spec, hyper, _ = await run_in_threadpool(check_create, svc, who.tenant, body)
    method = spec["type"]
    tokens = await run_in_threadpool(_tokens_of, svc.store, who.tenant, body.training_file, method, hyper["resolved"])
    trained = tokens * hyper["resolved"]["n_epochs"]
    rate = svc.store.ledger.fine_tuning_rate()
    out = {"object": "fine_tuning.job.estimate", "trained_tokens": trained, "method": method,
           "hyperparameters": hyper["public"]}
    if rate is not None:
        out.update(estimated_seconds=trained / rate["tokens_per_second"],
                   estimated_dollars=trained * rate["dollars_per_token"],
                   basis=f"{rate['jobs']} finished jobs on this server")
    return out


@jobs.get("/v1/fine_tuning/jobs", responses=error_responses(400, 401))
async def list_jobs(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    meta = {k[9:-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")}
    rows, more = svc.store.jobs.list(who.tenant, after=request.query_params.get("after"), limit=limit_of(request),
                                     metadata=meta or None)
    return _page([_job(j) for j in rows], more)


def own_job(svc: Services, tenant: str, job_id: str) -> dict:
    return found(svc.store.jobs.get(tenant, job_id), f"fine-tuning job: {job_id}", "fine_tuning_job_id")


@jobs.get("/v1/fine_tuning/jobs/{job_id}", responses=error_responses(401, 404))
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


for _action in ACTIONS:
    jobs.post(f"/v1/fine_tuning/jobs/{{job_id}}/{_action}", name=f"{_action}_job",
              responses=error_responses(401, 404, 409))(_act(_action))


def _job_list(what: str, shape):
    """A job's events or checkpoints, newest first, paged with after=<id>."""
    async def route(job_id: str, request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
        own_job(svc, who.tenant, job_id)
        rows, more = getattr(svc.store.jobs, what)(job_id, after=request.query_params.get("after"), limit=limit_of(request))
        return _page([shape(r) for r in rows], more)
    return route


for _what, _shape in (("events", _event), ("checkpoints", _checkpoint)):
    jobs.get(f"/v1/fine_tuning/jobs/{{job_id}}/{_what}", name=f"job_{_what}",
             responses=error_responses(400, 401, 404))(_job_list(_what, _shape))


@jobs.post("/v1/fine_tuning/jobs/{job_id}/promote", openapi_extra=json_body(PromoteRequest),
           responses=error_responses(400, 401, 403, 404, 409, 413))
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
    return await run_in_threadpool(_promote, svc.store, job, body, svc.production_dir())


@jobs.get("/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}/content", responses={
    200: {"description": "the checkpoint as a .tar.gz of one directory", "content": {"application/gzip": {}}},
    **error_responses(400, 401, 404, 409)}, openapi_extra={"parameters": [
        {"name": "format", "in": "query", "required": False,
         "schema": {"type": "string", "enum": list(FORMATS), "default": "merged"}}]})
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


SHAPE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "vocab_size", "num_local_experts")


def _promote(store: Store, job: dict, body: PromoteRequest, base_dir: str) -> dict:
    """The gate's verdict on a job's model, recorded as an event of the job."""
    import json
    from pathlib import Path

    from ..loop.gate import gate_and_promote
    from ..loop.config import GateRun

    current = store.versions.promoted()
    production = current["path"] if current else base_dir
    shape = lambda d: {k: v for k, v in json.loads((Path(d) / "config.json").read_text()).items() if k in SHAPE_KEYS}  # noqa: E731
    if shape(job["final_path"]) != shape(production):
        # servers swap weights in place: a model of another shape cannot take the slot
        raise APIError(409, f"the model of {job['id']} has another architecture than production ({production})",
                    param="fine_tuning_job_id")
    cfg = GateRun(env=body.env, suites=body.suites, gate=body.gate,
                  eval={"tasks": body.eval_tasks, "every": 0, "max_new_tokens": body.max_new_tokens})
    try:
        out = gate_and_promote(store, job["final_path"], base_dir, cfg)
    except ValueError as exc:        # an environment that cannot be built, too few held-out tasks
        raise APIError(400, str(exc), param="env") from None
    msg = (f"Promoted to production as version {out['version']}: {out['why']}" if out["promoted"]
           else f"Not promoted (production stays version {out['production_version']}): {out['why']}")
    store.jobs.add_event(job["id"], "info", msg, "message", out)
    return {"object": "fine_tuning.job.promotion", "fine_tuning_job_id": job["id"],
            "fine_tuned_model": job["fine_tuned_model"], **out}


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


def _sft_tokens(tok, rows: list[dict], hp: dict) -> int:
    from ..finetune.examples import sft_example

    return sum(len(sft_example(tok, r)[0]) for r in rows)


def _dpo_tokens(tok, rows: list[dict], hp: dict) -> int:
    from ..finetune.examples import completion_example

    return sum(len(completion_example(tok, r["input"]["messages"], r[k], r["input"].get("tools"))[0])
               for r in rows for k in ("preferred_output", "non_preferred_output"))


def _rft_tokens(tok, rows: list[dict], hp: dict) -> int:
    # group_size samples of each prompt, each at most max_new_tokens long
    return sum(hp["group_size"] * (len(tok.prompt_ids(r["messages"], tools=r.get("tools"))) + hp["max_new_tokens"])
               for r in rows)


# method -> tokens one epoch of its rows trains on
EPOCH_TOKENS = {"supervised": _sft_tokens, "dpo": _dpo_tokens, "reinforcement": _rft_tokens}


def _tokens_of(store: Store, tenant: str, file_id: str, method: str, hp: dict) -> int:
    """Tokens one epoch of a file trains on (rendered by the nano chat template: an estimate for
    other tokenizers)."""
    from ..bases.nano import nano_tokenizer

    return EPOCH_TOKENS[method](nano_tokenizer(), parse(store.files.content(tenant, file_id)).rows, hp)


__all__ = ["BASE_LR", "STATUSES", "files", "graders", "jobs"]
