"""What every route shares at the HTTP edge: OpenAI's error shape, the store's typed refusals as
status codes, reading a JSON body within the size limit into a request model, list limits."""
from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from ..store import Conflict, NotFound, StoreError

M = TypeVar("M", bound=BaseModel)

# what each refusal of the store answers (typed: never read from a message)
STATUS_OF = {StoreError: 400, NotFound: 404, Conflict: 409}


class APIError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    @classmethod
    def of(cls, exc: StoreError, param: str | None = None) -> "APIError":
        return cls(STATUS_OF[type(exc)], str(exc), param=param)


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


async def read_json(request: Request, max_bytes: int) -> Any:
    raw = await request.body()
    if len(raw) > max_bytes:
        raise APIError(413, f"request body of {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from None


def validate(model: type[M], data: Any) -> M:
    """`data` as `model`, or a 400 naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        raise APIError(400, f"{loc}: {e['msg']}", param=loc) from None


def limit_of(request: Request) -> int:
    """A list's `limit` query parameter (1..100, default 20)."""
    raw = request.query_params.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise APIError(400, "limit must be an integer in 1..100", param="limit")
    return int(raw)


def found(row: dict | None, what: str, param: str) -> dict:
    """The row, or a 404 (also for another tenant's ids: they do not exist for this one)."""
    if row is None:
        raise APIError(404, f"No such {what}", param=param)
    return row


def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else ""


def page(items: list[dict], more: bool) -> dict:
    """A list page; first_id / last_id name its ends (null when empty), as OpenAI's lists do."""
    return {"object": "list", "data": items, "has_more": more,
            "first_id": items[0]["id"] if items else None, "last_id": items[-1]["id"] if items else None}
