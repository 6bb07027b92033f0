"""What the routes use, in one typed object per app (routes get it through `Depends`, never from
closures): the config, the store, the base model's batcher and tokenizer, the fine-tuned models
served on demand, the sandbox python graders run in, the metrics; and who is calling."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from fastapi import Depends, Request

from ..engine import SamplingParams
from ..envs.graders import Runtime, SandboxPython
from ..models.chat import ChatTokenizer
from ..store import Store
from .batcher import Batcher
from .config import ServeConfig
from .http import APIError, bearer
from .metrics import ServeMetrics
from .pool import ModelPool


@dataclass(frozen=True)
class Caller:
    """An authenticated request: its key's id (for traces), its tenant, whether it is an admin key."""

    key_id: str | None
    tenant: str
    admin: bool
    episode: str | None = None      # an agent program's episode key (agents/gateway.py): its calls are captured


@dataclass
class Services:
    cfg: ServeConfig
    store: Store
    batcher: Batcher
    tok: ChatTokenizer
    metrics: ServeMetrics
    pool: ModelPool
    graders: SandboxPython = field(default_factory=SandboxPython)   # python graders run sandboxed
    name: str = ""
    keys: frozenset[str] = frozenset()
    serving_ledger: object = None        # accounting.rows.ServingLedger, set by serve.build
    worker: object = None                # finetune.worker.JobWorker beside the server, when it runs one
    follower: object = None              # server.Follower: the promotion follower's checks, set by serve.build
    capture: object = None               # agents.gateway.Capture: episode keys whose calls are recorded as tokens

    @classmethod
    def of(cls, cfg: ServeConfig, store: Store, batcher: Batcher, tok: ChatTokenizer, load) -> "Services":
        """`load(path) -> (batcher, tokenizer, bytes)` loads a fine-tuned model to serve."""
        keys = (set(cfg.api_keys) | set(cfg.admin_keys)
                | {k for k in os.environ.get("GYMLOOP_API_KEYS", "").split(",") if k})
        return cls(cfg, store, batcher, tok, ServeMetrics(batcher), ModelPool(cfg.max_loaded_mb << 20, load),
                   name=cfg.served_name(), keys=frozenset(keys))

    def authenticate(self, request: Request) -> Caller:
        """Every key is a tenant, named by a hash of the key; 401 without a valid one."""
        if not self.cfg.require_auth:
            return Caller(None, "org-public", False)
        key = bearer(request)
        if self.capture is not None and self.capture.is_open(key):
            return Caller(key[:4] + "…", "org-agents", False, episode=key)
        if not key or key not in self.keys:
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')", "authentication_error")
        return Caller(key[:4] + "…", "org-" + hashlib.sha256(key.encode()).hexdigest()[:12],
                      key in set(self.cfg.admin_keys))

    def served(self, model: str, tenant: str) -> tuple[Batcher, ChatTokenizer, str]:
        """The batcher, tokenizer and reported name of the model a request names (404: unknown)."""
        if model == self.name:
            return self.batcher, self.tok, self.name
        path = self.store.jobs.fine_tuned_model(tenant, model) if self.cfg.fine_tuning else None
        if path is None:
            raise APIError(404, f"model {model!r} not found; this server serves {self.name!r} and your "
                           "fine-tuned models (GET /v1/models)", param="model", code="model_not_found")
        b, t = self.pool.get(model, path)
        return b, t, model

    def servable(self, tenant: str, model: str) -> bool:
        return model == self.name or self.store.jobs.fine_tuned_model(tenant, model) is not None

    def resolve_trainable(self, tenant: str, model: str) -> str | None:
        """Weights a fine-tuning job of `tenant` may start from: a base this server trains, the
        served model, or the tenant's own fine-tuned model or checkpoint (None: none of these)."""
        from ..bases.registry import resolve_model

        if model == self.name:
            return str(resolve_model(self.cfg.model, progress=False))
        if model in self.cfg.trainable_models:
            return str(resolve_model(model, progress=False))
        return self.store.jobs.fine_tuned_model(tenant, model)

    def production_dir(self) -> str:
        """The served base model's directory."""
        return self.resolve_trainable("", self.name)

    def grader_chat(self, tenant: str, model: str, messages: list[dict], sampling: dict) -> str:
        """A score_model grader's call: `model` (one `tenant` may use) answers `messages`.
        Not a production request: no trace is stored. sampling: temperature (default 0: greedy),
        top_p, seed, max_completions_tokens (default 16)."""
        b, t, _ = self.served(model, tenant)
        max_tokens = min(int(sampling.get("max_completions_tokens") or 16), self.cfg.max_tokens_limit)
        params = SamplingParams(max_new_tokens=max_tokens, temperature=float(sampling.get("temperature") or 0.0),
                                top_p=float(sampling.get("top_p") or 1.0), stop_token_ids=t.eos_token_ids,
                                seed=sampling.get("seed"))
        gen = b.submit(t.prompt_ids(messages), params).future.result(timeout=300)
        return t.decode(gen.token_ids)

    def grader_runtime(self, tenant: str) -> Runtime:
        return Runtime(python=self.graders,
                       chat=lambda model, messages, sampling: self.grader_chat(tenant, model, messages, sampling))

    async def body(self, request: Request, model):
        """The request's JSON body as `model` (413 over the size limit, 400 naming a bad field)."""
        from .http import read_json, validate

        return validate(model, await read_json(request, self.cfg.max_request_bytes))

    def close(self) -> None:
        """Stop the fine-tuning worker (a running job stays `running` and is resumed by the next
        worker), the models served on demand, the graders' sandbox, the batcher; price the last
        seconds of serving."""
        if self.worker is not None:
            self.worker.stop()
        self.pool.close()
        self.graders.close()
        self.batcher.close()
        self.batcher.engine.close()      # a vLLM server started for this one
        if self.serving_ledger is not None:
            self.serving_ledger.flush()


def services(request: Request) -> Services:
    return request.app.state.services


def caller(request: Request, svc: Services = Depends(services)) -> Caller:
    return svc.authenticate(request)
