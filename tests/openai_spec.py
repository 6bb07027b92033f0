"""OpenAI's published OpenAPI document (tests/data/, pinned) as a validator of gymloop's answers:
`problems(path, method, body)` lists where `body` breaks the schema the document names for that
operation and status. The document mixes OpenAPI 3.0 habits into 3.1: `nullable: true` and boolean
`exclusiveMinimum` / `exclusiveMaximum` are read as meant (null allowed; the bound exclusive)."""
from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

from jsonschema import Draft202012Validator

SPEC = Path(__file__).parent / "data" / "openai-openapi.json.gz"


def _as_json_schema(node):
    """OpenAPI 3.0 spellings inside the document -> JSON Schema 2020-12."""
    if isinstance(node, list):
        return [_as_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_json_schema(v) for k, v in node.items() if k not in ("nullable", "discriminator", "x-oaiMeta")}
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool):
            if out.pop(bound) and inclusive in out:
                out[bound] = out.pop(inclusive)
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@functools.lru_cache(maxsize=1)
def spec() -> dict:
    return json.loads(gzip.decompress(SPEC.read_bytes()))


@functools.lru_cache(maxsize=1)
def _components() -> dict:
    return _as_json_schema(spec()["components"])


def schema_ref(path: str, method: str, status: str = "200", media: str = "application/json") -> str:
    """The component the document names for an operation's answer, e.g. '#/components/schemas/OpenAIFile'."""
    responses = spec()["paths"][path][method]["responses"]
    response = responses.get(status) or responses["default"]
    return response["content"][media]["schema"]["$ref"]


def problems_with(ref: str, body) -> list[str]:
    """Where `body` breaks the component `ref` (empty: it conforms)."""
    validator = Draft202012Validator({"$ref": ref, "components": _components()})
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '(body)'}: {e.message[:300]}"
                  for e in validator.iter_errors(body))


def problems(path: str, method: str, body, status: str = "200", media: str = "application/json") -> list[str]:
    return problems_with(schema_ref(path, method, status, media), body)


ERROR = "#/components/schemas/ErrorResponse"


@functools.lru_cache(maxsize=1)
def _response_events() -> dict[str, str]:
    """Streamed response event type -> the component that defines it (from ResponseStreamEvent)."""
    schemas = spec()["components"]["schemas"]
    out = {}
    for ref in (r["$ref"] for r in schemas["ResponseStreamEvent"]["anyOf"]):
        for kind in schemas[ref.rsplit("/", 1)[1]]["properties"]["type"].get("enum", []):
            out[kind] = ref
    return out


def event_problems(event: dict) -> list[str]:
    """Where a streamed response event breaks the component of its `type` (an unknown type is one)."""
    ref = _response_events().get(event.get("type"))
    return problems_with(ref, event) if ref else [f"type: {event.get('type')!r} is not a response event"]
