"""Shared fixtures: tiny random models with the nano tokenizer (built in milliseconds)."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

from gymloop.chat import ChatTokenizer, build_char_tokenizer
from gymloop.serve.background import ServerThread, free_port  # noqa: F401  (tests import free_port from here)

torch.set_num_threads(1)


def tiny_llama(vocab_size: int, *, hidden: int = 32, layers: int = 2, heads: int = 4,
               kv_heads: int | None = None, seed: int = 0, model_type: str = "llama"):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads or heads, max_position_embeddings=256,
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
    from gymloop.checkpoint import save_model

    path = tmp_path_factory.mktemp("models") / "tiny"
    save_model(tiny_llama(tok.vocab_size, seed=1), tok, path)
    return path


def running_server(app) -> ServerThread:
    """Serve a FastAPI app in a thread; `with running_server(app) as base_url:`."""
    return ServerThread(app)
