"""POST /v1/completions: a raw text prompt in (no chat template), text and token log-probs out,
for RL drivers that work on raw text; `n` samples as one group, each answer a trace like a chat
completion's. Streaming is not offered here (a 400 says so)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, WithJsonSchema

from .config import ServeConfig
from .core import MAX_N, Prepared, check_prompt, check_token_limits, commit_trace, generate, reply_text, resolve, \
    sampling
from .openapi import error_responses, json_body, json_int
from .services import Caller, Services, caller, services


def _not_streamed(stream: bool) -> bool:
    if stream:
        raise ValueError("stream is not offered on /v1/completions (use /v1/chat/completions)")
    return stream


class CompletionRequest(BaseModel):
    """The subset of OpenAI's completion request gymloop acts on; other fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]], Field(
        min_length=1, max_length=1)] = Field(description="The text to continue (a list: exactly one string).")
    max_tokens: json_int(1) | None = 16
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: json_int(1, MAX_N) = 1
    stop: str | list[str] | None = None
    seed: json_int(-2**63, 2**63 - 1) | None = Field(None, description="Sampling seed (OpenAI's int64 range).")
    logprobs: json_int(0, 5) | None = Field(None, description="Log-probs of each generated token, and of the "
                                              "k most likely tokens at each position.")
    return_token_ids: bool = Field(False, description="vLLM's extension: each choice's `prompt_token_ids` and "
                                   "sampled `token_ids`, so whoever trains on them never re-tokenizes.")
    stream: Annotated[StrictBool, AfterValidator(_not_streamed), WithJsonSchema({"type": "boolean", "const": False})] = \
        Field(False, description="Not offered here (false only): stream with /v1/chat/completions.")


def _logprobs(tok, gen, k: int) -> dict:
    """OpenAI's legacy completion log-probs: tokens, their log-probs, the top k per position, offsets."""
    tokens = [tok.decode([t]) for t in gen.token_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    top = [{tok.decode([a]): b for a, b in gen.top_logprobs[i]} if gen.top_logprobs else {}
           for i in range(len(tokens))]
    return {"tokens": tokens, "token_logprobs": list(gen.logprobs), "top_logprobs": top if k else None,
            "text_offset": offsets}


async def _prepare(svc: Services, req: CompletionRequest, who: Caller) -> Prepared:
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    batcher, tok, name = await resolve(svc, req.model, who)
    check_token_limits(svc.cfg, req, ("max_tokens",))
    prompt = tok.encode(prompts[0])
    check_prompt(svc.cfg, prompt, "prompt")
    params, stop = sampling(tok, req.max_tokens or svc.cfg.default_max_tokens, req.temperature, req.top_p,
                            req.stop, req.seed, req.logprobs or 0)
    return Prepared(req, who, batcher, tok, name, prompt, params, stop, n=req.n).with_id_prefix("cmpl-")


def _choice(p: Prepared, gen, index: int) -> dict:
    ids = {"prompt_token_ids": list(p.prompt), "token_ids": list(gen.token_ids)} if p.req.return_token_ids else {}
    return {"index": index, "text": reply_text(p, gen), "finish_reason": "stop" if gen.finish_reason == "stop" else "length",
            "logprobs": None if p.req.logprobs is None else _logprobs(p.tok, gen, p.req.logprobs), **ids}


async def completions(request: Request, svc: Services = Depends(services), who: Caller = Depends(caller)):
    p = await _prepare(svc, await svc.body(request, CompletionRequest), who)
    gens, version = await generate(p)
    n_gen = sum(len(g.token_ids) for g in gens)
    body = {"id": p.cid, "object": "text_completion", "created": p.created, "model": p.name,
            "system_fingerprint": f"gymloop-v{version}", "model_version": version,
            "choices": [_choice(p, g, i) for i, g in enumerate(gens)],
            "usage": {"prompt_tokens": len(p.prompt), "completion_tokens": n_gen,
                      "total_tokens": len(p.prompt) + n_gen}}
    trace_id = await commit_trace(svc, p, body, version, n_gen)
    return JSONResponse(body, headers={"x-gymloop-trace-id": trace_id, "x-gymloop-model-version": str(version)})


def router(cfg: ServeConfig) -> APIRouter:
    """POST /v1/completions; `cfg` shapes the documented schema (the served name, the token limit)."""
    r = APIRouter()
    r.add_api_route("/v1/completions", completions, methods=["POST"], openapi_extra=json_body(CompletionRequest, {
        "model": {"enum": [cfg.served_name()]}, "max_tokens": {"maximum": cfg.max_tokens_limit}}),
        responses=error_responses(400, 401, 404, 413))
    return r
