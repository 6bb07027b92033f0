"""The endpoint an agent program calls: `gymloop serve`'s own OpenAI API (chat completions, the
Responses API, tools, streaming) over a batcher of the training run's engine, on loopback, with one
API key per episode. Calls made with an episode's key are captured as tokens (capture.py) and
sample as the run does; any other key is refused (401), any other model name gets 404.

Concurrent episodes' calls share engine batches (the batcher groups requests of equal sampling
parameters), so `concurrency` programs at once cost about one batched generation per round of
calls, not one per program.
"""
from __future__ import annotations

import dataclasses
import secrets
import tempfile
import threading
from pathlib import Path

from ..engine import SamplingParams
from ..models.chat import ChatTokenizer
from ..serve.background import ServerThread
from ..serve.batcher import Batcher
from ..rollout.capture import Call


class Capture:
    """Open episodes (their keys) and the calls each has made; the run's sampling for them."""

    def __init__(self) -> None:
        self._calls: dict[str, list[Call]] = {}
        self._lock = threading.Lock()
        self.params: SamplingParams | None = None    # the run's sampling, set before each batch of episodes
        self.overridden = 0                           # requests whose own sampling was replaced

    def open(self) -> str:
        """A new episode: its API key."""
        key = "sk-episode-" + secrets.token_hex(16)
        with self._lock:
            self._calls[key] = []
        return key

    def open_count(self) -> int:
        """Episodes open now."""
        return len(self._calls)

    def is_open(self, key: str) -> bool:
        with self._lock:
            return key in self._calls

    def record(self, key: str, **call) -> None:
        """A call answered for episode `key` (Call's fields)."""
        call = Call(**call)
        with self._lock:
            if key in self._calls:          # a call answered after its episode closed is not the episode's
                self._calls[key].append(call)

    def close(self, key: str) -> list[Call]:
        """End an episode: its key stops working (401), and its calls are returned in the order
        they were answered."""
        with self._lock:
            return self._calls.pop(key, [])

    def sampling(self, key: str, asked: SamplingParams, room: int) -> SamplingParams:
        """The run's temperature, top-p and token cap, whatever the program asked (its stop strings
        stay: they are part of the program), within the `room` the prompt leaves in the context.
        No seed: the group's episodes must sample apart."""
        run = self.params
        if run is None:
            return asked
        if (asked.temperature, asked.top_p, asked.max_new_tokens) != (run.temperature, run.top_p, run.max_new_tokens):
            with self._lock:
                self.overridden += 1
        return dataclasses.replace(asked, temperature=run.temperature, top_p=run.top_p,
                                   max_new_tokens=max(1, min(run.max_new_tokens, room)), seed=None, top_logprobs=0)


@dataclasses.dataclass
class Usage:
    """What the engine did for the gateway since the last `take`."""

    seconds: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0


class Gateway:
    """`with Gateway(engine, tok, "policy", context=2048) as gw:` serves the engine at `gw.base_url`
    (ends in /v1) until closed. The engine is the caller's: closing the gateway does not close it."""

    def __init__(self, engine, tok: ChatTokenizer, model_name: str, context: int, max_batch: int = 64,
                 max_wait_ms: float = 5.0) -> None:
        from ..serve.app import create_app
        from ..serve.config import ServeConfig
        from ..store import Store

        self.model_name = model_name
        self.capture = Capture()
        self.usage = Usage()
        self._usage_lock = threading.Lock()
        self._dir = tempfile.TemporaryDirectory(prefix="gymloop-agents-")
        # every call is a trace of this store too (a program's own debugging: GET /v1/responses/{id}
        # and previous_response_id need them); it lives as long as the gateway
        self.store = Store(Path(self._dir.name) / "calls.db")
        # a batch is full when every open episode has a call in it: no program is left to send one
        self.batcher = Batcher(engine, max_batch=max_batch, max_wait_s=max_wait_ms / 1000, on_batch=self._on_batch,
                               full=lambda n: n >= self.capture.open_count())
        cfg = ServeConfig(model=model_name, model_name=model_name, db=str(Path(self._dir.name) / "calls.db"),
                          fine_tuning=False, max_prompt_tokens=max(16, context), max_tokens_limit=1 << 20,
                          default_max_tokens=64, max_request_bytes=16 << 20)
        app = create_app(cfg, self.store, self.batcher, tok)
        app.state.services.capture = self.capture
        self._server = ServerThread(app)
        try:
            self.base_url = self._server.__enter__() + "/v1"
        except BaseException:
            self.batcher.close()
            self.store.close()
            self._dir.cleanup()
            raise

    def _on_batch(self, seconds: float, prompt_tokens: int, generated_tokens: int) -> None:
        with self._usage_lock:
            self.usage.seconds += seconds
            self.usage.prompt_tokens += prompt_tokens
            self.usage.generated_tokens += generated_tokens

    def take_usage(self) -> Usage:
        """The engine's seconds and tokens since the last call."""
        with self._usage_lock:
            used, self.usage = self.usage, Usage()
        return used

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._server.__exit__(None, None, None)
        self.batcher.close()
        self.store.close()
        self._dir.cleanup()
