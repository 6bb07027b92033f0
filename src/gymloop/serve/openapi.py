"""What /openapi.json says of routes that read their bodies themselves (to bound their size and
word their errors): the bodies and every error status they answer with, as OpenAI's error
object. Shared by the chat routes and the fine-tuning routes."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, Strict, WithJsonSchema


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error answer: OpenAI's error object."""

    error: ErrorDetail


def json_body(body: type[BaseModel], narrow: dict[str, dict] | None = None) -> dict:
    """OpenAPI for a route that reads its JSON body itself (to bound its size and word its errors):
    the body is still declared, so /openapi.json describes what the route accepts. `narrow` adds
    this server's own limits to fields (the model it serves, its max_tokens limit)."""
    schema = body.model_json_schema()
    for field, extra in (narrow or {}).items():
        prop = schema["properties"][field]
        for option in prop.get("anyOf", [prop]):       # an optional field: narrow its non-null form
            if option.get("type") != "null":
                option.update(extra)
    defs = schema.pop("$defs", {})

    def inline(node):   # the nested models in place: the body's schema stands on its own
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


def error_responses(*codes: int) -> dict:
    why = {400: "bad request (the message names the field)", 401: "missing or invalid API key", 403: "the key may not do this (admin only)",
           404: "unknown model, trace, file or job (another tenant's ids too)", 409: "not in a state that allows it",
           413: "request body too large", 422: "unprocessable request", 503: "retry: the model was unloaded"}
    return {c: {"model": ErrorBody, "description": why[c]} for c in codes}


def _json_integer(value: Any) -> Any:
    if isinstance(value, (str, bool)):
        raise ValueError("must be a JSON integer")
    return value


def json_int(minimum: int | None = None, maximum: int | None = None):
    """An integer as JSON Schema means it: 5 and 5.0 are integers, "5" and true are not (the
    request models are otherwise strict, and strict pydantic would refuse 5.0), with its bounds
    both enforced and written into the schema."""
    bounds = {k: v for k, v in (("minimum", minimum), ("maximum", maximum)) if v is not None}
    return Annotated[int, Strict(False), BeforeValidator(_json_integer),
                     Field(ge=minimum, le=maximum), WithJsonSchema({"type": "integer", **bounds})]
