"""`gymloop serve`: an OpenAI-compatible chat API over the engine, every answer a trace.

Routes: GET /v1/models, POST /v1/chat/completions (plain and streamed), POST /v1/feedback,
GET /healthz, GET /metrics (Prometheus). Keys are required by default; a request without a
valid key gets 401 and leaves no trace. A trace is committed to the store before the response
(or, streamed, its final chunk) is sent. The answering model version is in the response.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from ..models.chat import ChatTokenizer
from ..engine import SamplingParams
from ..store import Conflict, NotFound, Store, StoreError
from .fine_tuning import add_routes
from .pool import ModelPool
from .batcher import Batcher, BatcherStopped
from .openapi import error_responses, json_body, json_int
from .config import ServeConfig
from .dashboard import PAGE, dashboard_data

# what each refusal of the store answers (typed: never read from a message)
STATUS_OF = {StoreError: 400, NotFound: 404, Conflict: 409}


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        self.status, self.message, self.kind, self.param = status, message, kind, param


JSONInt = json_int()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="Who wrote the message; any other role is a 400.")
    content: str | None = None


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}},
                             description="JSON schema of the arguments (default: none).")


class ChatTool(BaseModel):
    """A tool the model may call (OpenAI's function tool), rendered by the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatRequest(BaseModel):
    """The subset of OpenAI's chat request gymloop acts on; other fields are accepted and ignored.
    Strict: a value of the wrong JSON type ("5" for 5) is a 400, not silently converted."""

    # top_logprobs > 0 needs logprobs: true (as OpenAI's API), stated in the schema too
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={
        "if": {"properties": {"top_logprobs": {"type": "integer", "minimum": 1}}, "required": ["top_logprobs"]},
        "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}})
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: json_int(1) | None = None
    max_completion_tokens: json_int(1) | None = None
    temperature: float = Field(1.0, ge=0, le=2, description="0 (or below 1e-4, where logits / T overflows): "
                               "greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    stream: bool = False
    n: json_int(1, 1) = 1
    seed: JSONInt | None = None
    tools: list[ChatTool] | None = None
    logprobs: bool = Field(False, description="Return the log-prob of each generated token (under the sampling "
                           "temperature's distribution, as the engine samples and a trainer recomputes).")
    top_logprobs: json_int(0, 20) | None = Field(None, description="With logprobs: also the k most likely tokens "
                                     "at each position.")


class TaskRef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    env: str
    version: JSONInt | None = None
    task_id: str | None = None


class FeedbackRequest(BaseModel):
    # "a reward or a label" stated in the schema too, so /openapi.json documents what is accepted
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"required": ["reward"], "properties": {"reward": {"type": "number"}}},
        {"required": ["label"], "properties": {"label": {"type": "string"}}}]})
    trace_id: str
    reward: float | None = Field(None, ge=0, le=1)
    label: str | None = Field(None, max_length=200)
    task: TaskRef | None = None


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.tokens_served = 0
        self.latency_sum = 0.0
        self.latency_count = 0

    def count(self, status: int) -> None:
        self.requests[str(status)] = self.requests.get(str(status), 0) + 1

    def render(self, version: int, batcher: Batcher) -> str:
        lines = ["# TYPE gymloop_requests_total counter"]
        lines += [f'gymloop_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())]
        lines += ["# TYPE gymloop_tokens_served_total counter", f"gymloop_tokens_served_total {self.tokens_served}",
                  "# TYPE gymloop_request_seconds summary",
                  f"gymloop_request_seconds_sum {self.latency_sum}", f"gymloop_request_seconds_count {self.latency_count}",
                  "# TYPE gymloop_model_version gauge", f"gymloop_model_version {version}",
                  "# TYPE gymloop_engine_batches_total counter", f"gymloop_engine_batches_total {batcher.batches}",
                  "# TYPE gymloop_batched_requests_total counter",
                  f"gymloop_batched_requests_total {batcher.batched_requests}"]
        return "\n".join(lines) + "\n"


def _token_entry(tok: ChatTokenizer, token_id: int, logprob: float) -> dict:
    text = tok.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def token_logprobs(tok: ChatTokenizer, gen) -> dict:
    """OpenAI's `choices[].logprobs`: one entry per generated token (EOS included, as sampled),
    each with its `top_logprobs` when they were asked for."""
    content = []
    for i, (t, lp) in enumerate(zip(gen.token_ids, gen.logprobs)):
        entry = _token_entry(tok, t, lp)
        entry["top_logprobs"] = [_token_entry(tok, a, b) for a, b in gen.top_logprobs[i]] if gen.top_logprobs else []
        content.append(entry)
    return {"content": content, "refusal": None}


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def create_app(cfg: ServeConfig, store: Store, batcher: Batcher, tok: ChatTokenizer) -> FastAPI:
    app = FastAPI(title="gymloop", version="0.1.0")
    name = base_name = cfg.served_name()      # chat() rebinds `name` to the model a request names
    keys = (set(cfg.api_keys) | set(cfg.admin_keys)
            | {k for k in os.environ.get("GYMLOOP_API_KEYS", "").split(",") if k})
    metrics = Metrics()
    app.state.store, app.state.batcher, app.state.metrics = store, batcher, metrics

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        metrics.count(exc.status)
        return _error(exc.status, exc.message, exc.kind, exc.param)

    @app.middleware("http")
    async def _allow(request: Request, call_next):
        # a 405 names every method of the path (Starlette names only the first route's)
        response = await call_next(request)
        if response.status_code == 405:
            path = request.url.path
            matching = [r for r in app.routes if isinstance(r, APIRoute) and r.path_regex.match(path)]
            # a path written out (/v1/fine_tuning/jobs/estimate) is that resource, not a template's id
            static = [r for r in matching if "{" not in r.path]
            response.headers["allow"] = ", ".join(sorted({m for r in static or matching for m in r.methods}))
        return response

    def authenticate(request: Request) -> tuple[str | None, str]:
        """(key id for traces, tenant): every key is a tenant, named by a hash of the key."""
        if not cfg.require_auth:
            return None, "org-public"
        key = _bearer(request)
        if not key or key not in keys:
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                           "authentication_error")
        return key[:4] + "…", "org-" + hashlib.sha256(key.encode()).hexdigest()[:12]

    def auth(request: Request) -> str | None:
        return authenticate(request)[0]

    # fine-tuned models, served by id on demand (loaded within a memory budget)
    pool = ModelPool(cfg.max_loaded_mb << 20, lambda path: _load_for_serving(path, cfg))
    app.state.pool = pool

    def served(model: str, tenant: str) -> tuple[Batcher, ChatTokenizer, str]:
        """The batcher, tokenizer and reported name of the model a request names (404: unknown)."""
        if model == name:
            return batcher, tok, name
        path = store.jobs.fine_tuned_model(tenant, model) if cfg.fine_tuning else None
        if path is None:
            raise APIError(404, f"model {model!r} not found; this server serves {name!r} and your "
                           "fine-tuned models (GET /v1/models)", param="model")
        b, t = pool.get(model, path)
        return b, t, model

    def resolve_trainable(tenant: str, model: str) -> str | None:
        """Weights a fine-tuning job of `tenant` may start from: a base this server trains, the
        served model, or the tenant's own fine-tuned model or checkpoint (None: none of these)."""
        from ..bases.registry import resolve_model

        if model == name:
            return str(resolve_model(cfg.model, progress=False))
        if model in cfg.trainable_models:
            return str(resolve_model(model, progress=False))
        return store.jobs.fine_tuned_model(tenant, model)

    app.state.resolve_trainable = resolve_trainable

    def grader_chat(tenant: str, model: str, messages: list[dict], sampling: dict) -> str:
        """A score_model grader's call: `model` (one `tenant` may use) answers `messages`.
        Not a production request: no trace is stored. sampling: temperature (default 0: greedy),
        top_p, seed, max_completions_tokens (default 16)."""
        b, t, _ = served(model, tenant)
        max_tokens = min(int(sampling.get("max_completions_tokens") or 16), cfg.max_tokens_limit)
        params = SamplingParams(max_new_tokens=max_tokens, temperature=float(sampling.get("temperature") or 0.0),
                                top_p=float(sampling.get("top_p") or 1.0), stop_token_ids=t.eos_token_ids,
                                seed=sampling.get("seed"))
        gen = b.submit(t.prompt_ids(messages), params).future.result(timeout=300)
        return t.decode(gen.token_ids)

    app.state.grader_chat = grader_chat

    async def body_json(request: Request) -> Any:
        raw = await request.body()
        if len(raw) > cfg.max_request_bytes:
            raise APIError(413, f"request body of {len(raw)} bytes exceeds the limit of {cfg.max_request_bytes}")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}") from None

    def validate(model: type[BaseModel], data: Any) -> Any:
        try:
            return model.model_validate(data)
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(x) for x in e["loc"])
            raise APIError(400, f"{loc}: {e['msg']}", param=loc) from None

    @app.get("/", response_class=HTMLResponse)
    async def dashboard():
        return HTMLResponse(PAGE)

    @app.get("/v1/dashboard")
    async def dashboard_json():
        # Aggregates only (counts, scores, costs), never trace contents: readable without a key.
        return await run_in_threadpool(dashboard_data, store, batcher, metrics, name)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "model": name, "model_version": batcher.version}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prom():
        return PlainTextResponse(metrics.render(batcher.version, batcher))

    @app.get("/v1/models", responses=error_responses(401))
    async def models(request: Request):
        _, tenant = authenticate(request)
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "gymloop", "version": batcher.version}]
        data += [{"id": m["id"], "object": "model", "created": int(m["created"]), "owned_by": tenant,
                  "fine_tuning_job": m["job"]} for m in store.jobs.fine_tuned_models(tenant)]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatRequest, {
        "model": {"enum": [name]}, "max_tokens": {"maximum": cfg.max_tokens_limit},
        "max_completion_tokens": {"maximum": cfg.max_tokens_limit}}), responses={
        200: {"description": "a chat.completion, or with stream: true a text/event-stream of chunks",
              "content": {"application/json": {}, "text/event-stream": {}}}, **error_responses(400, 401, 404, 413)})
    async def chat(request: Request):
        t0 = time.perf_counter()
        key_id, tenant = authenticate(request)
        req: ChatRequest = validate(ChatRequest, await body_json(request))
        # the base model is at hand; a fine-tuned one may have to be loaded first (off the event loop)
        batcher, tok, name = (served(req.model, tenant) if req.model == base_name
                              else await run_in_threadpool(served, req.model, tenant))
        for field in ("max_tokens", "max_completion_tokens"):     # each, even the one not used
            value = getattr(req, field)
            if value is not None and value > cfg.max_tokens_limit:
                raise APIError(400, f"{field} {value} exceeds the limit of {cfg.max_tokens_limit}", param=field)
        max_tokens = req.max_completion_tokens or req.max_tokens or cfg.default_max_tokens
        messages = [{"role": m.role, "content": m.content or ""} for m in req.messages]
        try:
            prompt = tok.prompt_ids(messages, tools=[t.model_dump() for t in req.tools] if req.tools else None)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render this input
            raise APIError(400, f"messages could not be rendered by the chat template: {exc}") from None
        if len(prompt) > cfg.max_prompt_tokens:
            raise APIError(400, f"prompt of {len(prompt)} tokens exceeds the limit of {cfg.max_prompt_tokens}",
                           param="messages")
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        params = SamplingParams(max_new_tokens=max_tokens, temperature=req.temperature if req.temperature >= 1e-4 else 0.0,
                                top_p=req.top_p,
                                stop_token_ids=tok.eos_token_ids, stop=stop, seed=req.seed,
                                top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        request_record = req.model_dump(exclude_none=True)

        async def finish(gen, version: int) -> tuple[dict, str]:
            text = tok.decode(gen.token_ids)
            for s in stop:  # the stop string itself is not part of the answer (OpenAI semantics)
                if s and s in text:
                    text = text[: text.index(s)]
            finish_reason = "stop" if gen.finish_reason == "stop" else "length"
            body = {"id": cid, "object": "chat.completion", "created": created, "model": name,
                    "system_fingerprint": f"gymloop-v{version}", "model_version": version,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish_reason,
                                 "logprobs": token_logprobs(tok, gen) if req.logprobs else None}],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen.token_ids),
                              "total_tokens": len(prompt) + len(gen.token_ids)}}
            latency = time.perf_counter() - t0
            # Committed before the response leaves: a 200 always has its trace.
            trace_id = await asyncio.wrap_future(store.traces.add_committed(
                model=name, model_version=version, request=request_record, response=body,
                prompt_tokens=len(prompt), completion_tokens=len(gen.token_ids), latency_s=latency,
                key_id=key_id, trace_id=cid))
            metrics.count(200)
            metrics.tokens_served += len(gen.token_ids)
            metrics.latency_sum += latency
            metrics.latency_count += 1
            return body, trace_id

        if not req.stream:
            r = batcher.submit(prompt, params)
            try:
                gen = await asyncio.wrap_future(r.future)
            except BatcherStopped as exc:
                raise APIError(503, str(exc), "server_error") from None
            body, trace_id = await finish(gen, r.version)
            return JSONResponse(body, headers={"x-gymloop-trace-id": trace_id,
                                               "x-gymloop-model-version": str(r.version)})

        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()
        r = batcher.submit(prompt, params, on_token=lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t))
        done = asyncio.wrap_future(r.future)

        async def events():
            def chunk(delta: dict, finish_reason=None) -> str:
                return "data: " + json.dumps({
                    "id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "system_fingerprint": f"gymloop-v{r.version if r.version >= 0 else batcher.version}",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}) + "\n\n"

            yield chunk({"role": "assistant", "content": ""})
            sent: list[int] = []
            shown = ""
            while not (done.done() and tokens.empty()):
                try:
                    t = await asyncio.wait_for(tokens.get(), timeout=0.05)
                except asyncio.TimeoutError:
                    continue
                if t in tok.eos_token_ids:
                    continue
                sent.append(t)
                text = tok.decode(sent)
                if stop and any(s in text for s in stop):
                    continue       # held back; the final text is cut at the stop string
                if len(text) > len(shown):
                    yield chunk({"content": text[len(shown):]})
                    shown = text
            gen = done.result()
            body, _ = await finish(gen, r.version)
            final = body["choices"][0]["message"]["content"]
            if len(final) > len(shown) and final.startswith(shown):
                yield chunk({"content": final[len(shown):]})
            yield chunk({}, body["choices"][0]["finish_reason"])
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-gymloop-trace-id": cid})

    @app.post("/v1/feedback", openapi_extra=json_body(FeedbackRequest), responses=error_responses(400, 401, 404, 413))
    async def feedback(request: Request):
        auth(request)
        fb: FeedbackRequest = validate(FeedbackRequest, await body_json(request))
        if fb.reward is None and fb.label is None:
            raise APIError(400, "feedback needs a reward (0..1) or a label", param="reward")
        try:
            fid = await run_in_threadpool(
                store.traces.add_feedback, fb.trace_id, reward=fb.reward, label=fb.label,
                env=fb.task.env if fb.task else None, env_version=fb.task.version if fb.task else None,
                task_id=fb.task.task_id if fb.task else None)
        except StoreError as exc:
            raise APIError(STATUS_OF[type(exc)], str(exc), param="trace_id") from None
        metrics.count(200)
        return {"id": fid, "trace_id": fb.trace_id}

    if cfg.fine_tuning:
        add_routes(app, store=store, tenant_of=lambda r: authenticate(r)[1], body_json=body_json, validate=validate,
                   error=APIError, trainable=lambda tenant, model: resolve_trainable(tenant, model) is not None,
                   chat=grader_chat,
                   servable=lambda tenant, model: model == name or store.jobs.fine_tuned_model(tenant, model) is not None,
                   is_admin=lambda r: bool(cfg.require_auth and _bearer(r) in set(cfg.admin_keys)),
                   production_dir=lambda: resolve_trainable("", name))
    return app


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else ""


def _load_for_serving(path: str, cfg: ServeConfig) -> tuple[Batcher, ChatTokenizer, int]:
    """A fine-tuned model's own engine and batcher (it may have another tokenizer than the base)."""
    from ..engine import Engine
    from ..models.checkpoint import load_model

    model, tok = load_model(path)
    engine = Engine(model, tok.pad_token_id, decode=tok.decode, version=0)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return Batcher(engine, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000), tok, size
