"""/v1/files of the fine-tuning API: upload (multipart), list, retrieve, content, delete. Every
API key is a tenant: it sees only its own files, and another tenant's ids are 404s. A file that
fails validation is kept and listed with the first bad line."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..finetune.formats import FormatError, parse
from .config import ServeConfig
from .http import APIError, found, limit_of, page
from .openapi import error_responses
from .services import Caller, Services, caller, services

UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["fine-tune"]}}}}}}}
MAX_FILE_BYTES = 512 << 20


def file_object(f: dict) -> dict:
    # files never expire here: no expires_at (the schema has no null for it); status_details only
    # when there is one (why a file failed validation)
    out = {"id": f["id"], "object": "file", "bytes": f["bytes"], "created_at": int(f["created"]),
           "filename": f["filename"], "purpose": f["purpose"], "status": f["status"]}
    if f["status_details"] is not None:
        out["status_details"] = f["status_details"]
    return out


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
    return file_object(f)


async def list_files(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    rows, more = svc.store.files.list(who.tenant, after=request.query_params.get("after"), limit=limit_of(request),
                                      purpose=request.query_params.get("purpose"))
    return page([file_object(f) for f in rows], more)


def own_file(svc: Services, tenant: str, file_id: str) -> dict:
    return found(svc.store.files.get(tenant, file_id), f"File object: {file_id}", "id")


async def get_file(file_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    return file_object(own_file(svc, who.tenant, file_id))


async def file_content(file_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    own_file(svc, who.tenant, file_id)
    return Response(svc.store.files.content(who.tenant, file_id), media_type="application/octet-stream")


async def delete_file(file_id: str, svc: Services = Depends(services), who: Caller = Depends(caller)):
    own_file(svc, who.tenant, file_id)
    svc.store.files.delete(who.tenant, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


def router(cfg: ServeConfig) -> APIRouter:
    r = APIRouter()
    r.add_api_route("/v1/files", create_file, methods=["POST"], openapi_extra=UPLOAD_BODY,
                    responses=error_responses(400, 401, 413))
    r.add_api_route("/v1/files", list_files, methods=["GET"], responses=error_responses(400, 401))
    r.add_api_route("/v1/files/{file_id}", get_file, methods=["GET"], responses=error_responses(401, 404))
    r.add_api_route("/v1/files/{file_id}/content", file_content, methods=["GET"], responses={
        200: {"description": "the file as uploaded", "content": {"application/octet-stream": {}}},
        **error_responses(401, 404)})
    r.add_api_route("/v1/files/{file_id}", delete_file, methods=["DELETE"], responses=error_responses(401, 404))
    return r
