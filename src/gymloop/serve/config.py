"""Configuration of `gymloop serve`."""
from __future__ import annotations

from pathlib import Path


from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..backends import check_backend
from ..config import EngineBackend, EngineDtype, VLLMSettings


class ServeConfig(BaseModel):
    """The OpenAI-compatible server."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("nano", description="'nano', 'smollm2' or a HF model directory to serve.")
    model_name: str | None = Field(None, description="Model id clients send (default: gymloop-<model>).")
    db: str = Field("gymloop.db", description="The store for traces, feedback, versions and jobs: a SQLite file, "
                    "or a PostgreSQL URL (postgresql://user@host/db) that several servers and workers share.")
    api_keys: list[str] = Field(default_factory=list, description="Accepted Bearer keys (also GYMLOOP_API_KEYS).")
    admin_keys: list[str] = Field(default_factory=list, description="Keys (accepted like api_keys) that may also "
                                  "promote a fine-tuned model into production through the gate.")
    require_auth: bool = Field(True, description="Refuse requests without a valid key (401, no trace).")
    max_request_bytes: int = Field(1 << 20, ge=1024, description="Largest request body accepted (413 above).")
    max_prompt_tokens: int = Field(2048, ge=16, description="Longest rendered prompt accepted (400 above).")
    max_tokens_limit: int = Field(512, ge=1, description="Largest max_tokens a request may ask for.")
    default_max_tokens: int = Field(64, ge=1, description="max_tokens when a request gives none.")
    max_batch: int = Field(64, ge=1, description="Most requests in one engine batch.")
    engine_dtype: EngineDtype = Field(
        "model", description="The dtype generation computes in (engine.ENGINE_DTYPES): model (the parameters' own) "
        "or bfloat16 (cast copies, remade at each promotion; 2-3x faster prefill on CPUs with AMX; vLLM: its --dtype).")
    engine_backend: EngineBackend = Field(
        "auto", description="What generates the served model's answers: gymloop's engine (auto, llama, hf) or vllm "
        "(a vLLM server in its own process and venv, `make vllm`, started with the server and again if it dies; a "
        "promotion is a weight load into it). Fine-tuned models served on demand run on gymloop's engine.")
    vllm_url: str | None = Field(None, description="engine_backend vllm: a running vLLM server (started with "
                                 "gymloop's worker extension) to use instead of starting one.")
    max_wait_ms: float = Field(5.0, ge=0, description="How long the batcher waits to fill a batch.")
    threads: int = Field(1, ge=1, description="torch CPU threads (`gymloop serve` sets them for the process).")
    poll_s: float = Field(1.0, gt=0, description="How often the store is checked for a newly promoted version.")
    cost_profile: str = Field("cpu-2vcpu", description="Hardware profile serving is priced on (profiles.yaml).")
    fine_tuning: bool = Field(True, description="Serve the fine-tuning API (/v1/files, /v1/fine_tuning/jobs).")
    job_worker: bool = Field(True, description="Run the store's queued fine-tuning jobs in a worker thread of this "
                             "server; off: `gymloop worker` processes run them (any number, one job at a time each).")
    jobs_dir: str | None = Field(None, description="Where fine-tuning jobs keep checkpoints and models "
                                 "(default: ft-jobs/ beside a SQLite store, ./ft-jobs with PostgreSQL; "
                                 "workers on several machines need one shared directory).")
    trainable_models: list[str] = Field(default_factory=lambda: ["nano", "nano-tools", "nano-moe"],
                                        description="Base models a fine-tuning job may start from (model names "
                                        "of `gymloop train`; the served model is one too).")
    checkpoint_every: int = Field(0, ge=0, description="Fine-tuning checkpoint interval in steps (0: every epoch).")
    max_loaded_mb: int = Field(2048, ge=1, description="Memory budget of fine-tuned models served on demand "
                               "(least recently used ones are unloaded).")

    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="engine_backend vllm: how it is started.")

    @model_validator(mode="after")
    def _backend_can(self) -> "ServeConfig":
        check_backend(self.engine_backend, dtype=self.engine_dtype)
        return self

    def default_jobs_dir(self) -> Path:
        """ft-jobs/ beside a SQLite store's file; with a PostgreSQL store, ./ft-jobs."""
        if self.db.startswith(("postgresql://", "postgres://")):
            return Path("ft-jobs").resolve()
        return Path(self.db).resolve().parent / "ft-jobs"

    def served_name(self) -> str:
        if self.model_name:
            return self.model_name
        from pathlib import Path

        return f"gymloop-{Path(self.model).name}"
