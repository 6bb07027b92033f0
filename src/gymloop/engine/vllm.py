"""vLLM as the generation engine: the engine interface (token ids in; sampled ids and their
log-probs out; versioned weight loads) over a vLLM server in its own process and venv.

vLLM pins its own torch and transformers, so it cannot share gymloop's venv: `make vllm` builds
`.venv-vllm` from `runtimes/vllm/requirements.lock` (or set GYMLOOP_VLLM_PYTHON to another
runtime's python). gymloop starts `vllm.entrypoints.openai.api_server` there on loopback, or
talks to one at a URL, and never re-tokenizes: prompts go in as token ids, completions come back
as vLLM's `token_ids` with each sampled token's log-prob (after temperature, as gymloop's own
engine reports it: `--logprobs-mode processed_logprobs`).

A new weight version is a safetensors file that gymloop's worker extension (vllm_worker.py)
loads with vLLM's `reload_weights` through `/collective_rpc`, then the prefix cache is reset, so
no answer mixes two versions' keys. A vLLM process that died is a VLLMError naming its exit and
the tail of its log: never a hang, never an empty completion scored as a failure.
"""
from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import httpx
import torch

from .sampling import Generation, GenerationBatch, SamplingParams

PYTHON_ENV = "GYMLOOP_VLLM_PYTHON"
# src/gymloop/engine -> the checkout, where `make vllm` builds the runtime
DEFAULT_RUNTIME = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
EXTENSION = "gymloop_vllm_worker.WeightLoader"


class VLLMError(RuntimeError):
    """vLLM is missing, did not start, or died."""

    user_facing = True           # the CLI prints it as a one-line error, not a traceback


def runtime_python() -> Path:
    """The python of vLLM's runtime venv; a one-line error naming the command that builds it."""
    python = Path(os.environ.get(PYTHON_ENV) or DEFAULT_RUNTIME)
    if not python.exists():
        raise VLLMError(f"vLLM's runtime is not installed ({python}): run `make vllm`, or set {PYTHON_ENV}")
    return python


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(python: Path, model_dir: str, port: int, dtype: str, max_model_len: int | None,
                   seed: int) -> list[str]:
    """The vLLM server gymloop runs: eager (no graph capture on CPU), gymloop's worker
    extension, log-probs after temperature, up to 20 of them (the API's top_logprobs)."""
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", "gymloop", "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--enforce-eager", "--worker-extension-cls", EXTENSION, "--logprobs-mode", "processed_logprobs",
           "--max-logprobs", "20", "--seed", str(seed), "--disable-log-stats"]
    return cmd + (["--max-model-len", str(max_model_len)] if max_model_len else [])


class VLLMServer:
    """A vLLM OpenAI-compatible server: started by gymloop from the runtime venv (`start`), or
    one already running at a URL (`at`)."""

    def __init__(self, url: str, proc: subprocess.Popen | None = None, workdir: Path | None = None) -> None:
        self.url, self.proc, self.workdir = url.rstrip("/"), proc, workdir
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(600.0, connect=10.0))

    @classmethod
    def at(cls, url: str) -> "VLLMServer":
        server = cls(url)
        server.wait_ready(60.0)
        return server

    @classmethod
    def start(cls, model_dir: str | Path, *, dtype: str = "float32", max_model_len: int | None = None,
              seed: int = 0, timeout_s: float = 600.0, threads: int | None = None) -> "VLLMServer":
        python = runtime_python()
        workdir = Path(tempfile.mkdtemp(prefix="gymloop-vllm-"))
        shutil.copy(Path(__file__).with_name("vllm_worker.py"), workdir / "gymloop_vllm_worker.py")
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(workdir), "VLLM_SERVER_DEV_MODE": "1",
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        log = open(workdir / "vllm.log", "wb")
        proc = subprocess.Popen(server_command(python, str(model_dir), port, dtype, max_model_len, seed),
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        server = cls(f"http://127.0.0.1:{port}", proc, workdir)
        try:
            server.wait_ready(timeout_s)
        except BaseException:
            server.close()
            raise
        return server

    def log_tail(self, chars: int = 3000) -> str:
        if self.workdir is None or not (self.workdir / "vllm.log").exists():
            return ""
        return (self.workdir / "vllm.log").read_bytes()[-chars:].decode(errors="replace")

    def died(self) -> str | None:
        """Why the process gymloop started is gone (None: alive, or not gymloop's to watch)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"vLLM exited with {self.proc.returncode}; its log ends:\n{self.log_tail()}"

    def wait_ready(self, timeout_s: float) -> None:
        """Until /health answers 200; a process that exits first fails at once."""
        deadline = time.monotonic() + timeout_s
        while True:
            if why := self.died():
                raise VLLMError(f"vLLM did not start: {why}")
            try:
                if self.http.get("/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise VLLMError(f"vLLM at {self.url} did not answer /health within {timeout_s:.0f} s\n{self.log_tail()}")
            time.sleep(0.5)

    def post(self, path: str, body: dict) -> dict:
        """POST a JSON body; a dead or unreachable server is a VLLMError, an error answer too."""
        try:
            r = self.http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise VLLMError(f"vLLM at {self.url} did not answer {path}: {exc}"
                            + (f"\n{self.died()}" if self.died() else "")) from None
        if r.status_code != 200:
            raise VLLMError(f"vLLM answered {path} with {r.status_code}: {r.text[:2000]}")
        return r.json() if r.content else {}

    def close(self) -> None:
        self.http.close()
        if self.proc is not None and self.proc.poll() is None:
            import signal

            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def completion_body(prompts: Sequence[Sequence[int]], params: SamplingParams) -> dict:
    """vLLM's /v1/completions request for token-id prompts with gymloop's sampling semantics: stop
    only at `stop_token_ids` (the model's EOS is not a stop unless listed), log-probs of every
    sampled token (and the top k), token ids back, nothing detokenized away."""
    body = {"model": "gymloop", "prompt": [list(p) for p in prompts], "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "logprobs": max(1, params.top_logprobs),
            "return_token_ids": True, "return_tokens_as_token_ids": True, "ignore_eos": True,
            "stop_token_ids": list(params.stop_token_ids), "skip_special_tokens": False}
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def equal_runs(prompts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(first index, length) of each run of consecutive equal prompts (a group is one run)."""
    runs: list[tuple[int, int]] = []
    for i, p in enumerate(prompts):
        if runs and list(prompts[runs[-1][0]]) == list(p):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def draw_seeds(seed: int, n: int) -> list[int]:
    """n seeds drawn from one (the same n for the same seed), each in vLLM's int64 range."""
    rng = random.Random(seed)
    return [rng.randrange(2**63) for _ in range(n)]


def _token_id(token: str) -> int:
    return int(token.removeprefix("token_id:"))


def generation_of(choice: dict, top_k: int) -> Generation:
    """A gymloop Generation from one vLLM completion choice (return_token_ids, token-id log-probs)."""
    lp = choice["logprobs"]
    top = [sorted(((_token_id(t), v) for t, v in (d or {}).items()), key=lambda x: -x[1])[:top_k]
           for d in lp["top_logprobs"]] if top_k else []
    return Generation(token_ids=list(choice["token_ids"]), logprobs=[float(x) for x in lp["token_logprobs"]],
                      finish_reason="stop" if choice["finish_reason"] == "stop" else "length", top_logprobs=top)


class VLLMEngine:
    """The engine interface (engine.Engine's) over a vLLM server."""

    backend_name = "vllm"
    native_unsupported = None
    record_routing = False

    def __init__(self, server: VLLMServer, pad_token_id: int, *, decode: Callable[[list[int]], str] | None = None,
                 version: int = 0, context: int | None = None) -> None:
        self.server, self.pad_token_id, self.decode = server, pad_token_id, decode
        self.version, self._context = version, context

    @classmethod
    def start(cls, model_dir: str | Path, pad_token_id: int, *, decode=None, version: int = 0,
              url: str | None = None, dtype: str = "float32", seed: int = 0) -> "VLLMEngine":
        import json

        config = json.loads((Path(model_dir) / "config.json").read_text())
        context = config.get("max_position_embeddings")
        server = VLLMServer.at(url) if url else VLLMServer.start(model_dir, dtype=dtype, max_model_len=context,
                                                                   seed=seed)
        return cls(server, pad_token_id, decode=decode, version=version, context=context)

    @property
    def context(self) -> int | None:
        return self._context

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")          # where gymloop's side of a generation lives (its ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> GenerationBatch:
        """Sample a completion for every prompt, as one vLLM request (its scheduler batches
        them). `on_token` is called with each finished completion's tokens in order."""
        t0 = time.perf_counter()
        if not prompts:
            return GenerationBatch([], 0, 0, 0.0, self.version)
        if params.seed is None:
            choices = self._complete(prompts, params)
        else:
            # vLLM applies a request's seed to each of its prompts alike: a GRPO group (one prompt
            # repeated) sent as G prompts would sample one completion G times. So each run of equal
            # prompts is one request for n samples with a seed of its own drawn from the batch's
            # (vLLM draws a request's n samples apart), the requests sent at once.
            runs = equal_runs(prompts)
            seeds = draw_seeds(params.seed, len(runs))
            with ThreadPoolExecutor(min(64, len(runs))) as pool:
                choices = [c for cs in pool.map(lambda k: self._complete(
                    [prompts[runs[k][0]]], dataclasses.replace(params, seed=seeds[k]), n=runs[k][1]),
                    range(len(runs))) for c in cs]
        gens = [generation_of(c, params.top_logprobs) for c in choices]
        if on_token is not None:
            for i, g in enumerate(gens):
                for t in g.token_ids:
                    on_token(i, t)
        return GenerationBatch(generations=gens, prompt_tokens=sum(len(p) for p in prompts),
                               generated_tokens=sum(len(g.token_ids) for g in gens),
                               seconds=time.perf_counter() - t0, version=self.version)

    def _complete(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1) -> list[dict]:
        """The completions of one request, in prompt order (n per prompt)."""
        answer = self.server.post("/v1/completions", {**completion_body(prompts, params), "n": n})
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts) * n:
            raise VLLMError(f"vLLM answered {len(choices)} completions for {len(prompts)} prompts x {n}")
        return choices

    @torch.no_grad()
    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int) -> int:
        """Send a weight version: written as one safetensors file, loaded by vLLM's workers
        (gymloop's extension), then the prefix cache reset. Returns the bytes sent."""
        from safetensors.torch import save_file

        items = weights.items() if isinstance(weights, Mapping) else weights
        # every name, tied ones too: vLLM's CPU backend repacks lm_head apart from embed_tokens, so a
        # tied model's head is only updated when it is sent (a second name of one storage is cloned:
        # safetensors stores no shared storage)
        tensors, seen = {}, set()
        for name, t in items:
            t = t.detach().to("cpu").contiguous()
            tensors[name] = t.clone() if t.data_ptr() in seen else t
            seen.add(t.data_ptr())
        fd, path = tempfile.mkstemp(suffix=".safetensors", prefix="gymloop-weights-")
        os.close(fd)
        try:
            save_file(tensors, path)
            self.server.post("/collective_rpc", {"method": "gymloop_load_weights", "kwargs": {"path": path}})
            self.server.post("/reset_prefix_cache", {})
        finally:
            os.unlink(path)
        self.version = version
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def bind_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        raise VLLMError("a vLLM engine takes weights by load_weights (a copy), not by sharing tensors")

    def close(self) -> None:
        self.server.close()
