"""The `nano` model: a small Llama pre-trained locally on the environments' own tasks.

It is the embedded default, as SQLite is for databases: built from nothing in a couple of
CPU minutes, cached by the hash of its config, so the whole loop runs on a laptop. The base
is deliberately only modestly accurate (RL from random weights gets no signal at all, while a
base that already solves everything leaves nothing to learn).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from ..algorithms.sft import sft_loss
from ..chat import ChatTokenizer, build_char_tokenizer, nano_hf_tokenizer, train_nano_tokenizer
from ..envs import make_env, play
from ..logprobs import make_batch, token_logprobs
from ..progress import progress as progress_bar

# Bump when the pre-training code changes what gets cached (the tokenizer enters the key itself).
RECIPE_VERSION = 3

# The tokenizer's training text: gold episodes of every built-in generator and tool-API version,
# as a real tokenizer is trained on broad text, so one vocabulary serves every nano variant and
# a tool-API change finds its new words already in the vocabulary (what changes is the model).
TOKENIZER_CORPUS = (("arith", {}), ("tools", {"version": 1}), ("tools", {"version": 2}),
                    ("tools", {"version": 3}))
TOKENIZER_EPISODES = 300     # per generator; the vocabulary stops growing well before
TOKENIZER_VOCAB = 512        # an upper bound: these corpora saturate at a few hundred sub-words


class CorpusSpec(BaseModel):
    """One task generator of the pre-training corpus (gold episodes of its train split)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("arith", description="Registered environment with a `draw(rng, split)` generator.")
    options: dict = Field(default_factory=dict, description="Its options.")
    copies: int = Field(1, ge=1, description="Relative weight in the corpus.")


class NanoConfig(BaseModel):
    """Architecture and pre-training budget of the nano model (all fields enter the cache key)."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = Field(128, ge=16, description="Model width.")
    layers: int = Field(2, ge=1, description="Transformer blocks.")
    heads: int = Field(4, ge=1, description="Attention heads (head_dim = hidden_size / heads).")
    intermediate_size: int = Field(512, ge=16, description="MLP width.")
    max_positions: int = Field(512, ge=32, description="Longest sequence the model supports.")
    corpus: list[CorpusSpec] = Field(
        default_factory=lambda: [CorpusSpec()],
        description="Task generators whose train split (gold episodes) forms the corpus.",
    )
    loss_on: str = Field("all", pattern="^(all|assistant)$",
                         description="Next-token loss on every token, or only on assistant replies.")
    steps: int = Field(1000, ge=1, description="Optimizer steps of pre-training (the fixed budget).")
    batch_size: int = Field(64, ge=1, description="Sequences per step.")
    lr: float = Field(3e-3, gt=0, description="Peak AdamW learning rate (linear warm-up, cosine decay).")
    seed: int = Field(0, description="Seed of initialisation and corpus sampling.")

    def key(self) -> str:
        tokenizer = hashlib.sha256(_nano_tokenizer_json().encode()).hexdigest()
        blob = json.dumps({"recipe": RECIPE_VERSION, "tokenizer": tokenizer, **self.model_dump()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    return Path(os.environ.get("GYMLOOP_CACHE", Path.home() / ".cache" / "gymloop"))


@functools.lru_cache(maxsize=1)
def _nano_tokenizer_json() -> str:
    texts = []
    rng = random.Random(0)
    renderer = ChatTokenizer(build_char_tokenizer())
    for name, options in TOKENIZER_CORPUS:
        env = make_env(name, **options)
        for _ in range(TOKENIZER_EPISODES):
            task = env.draw(rng, "train")
            msgs, _ = play(env, task, env.gold_turns(task))
            texts.append(renderer.render(msgs, add_generation_prompt=False, tools=env.tools(task)))
    return train_nano_tokenizer(texts, TOKENIZER_VOCAB).backend_tokenizer.to_str()


def nano_tokenizer() -> ChatTokenizer:
    """The nano model's sub-word tokenizer (trained locally in ~0.1 s; a fresh copy per call)."""
    from tokenizers import Tokenizer

    return ChatTokenizer(nano_hf_tokenizer(Tokenizer.from_str(_nano_tokenizer_json())))


def build_model(cfg: NanoConfig, tok: ChatTokenizer) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    if cfg.hidden_size % cfg.heads:
        raise ValueError(f"hidden_size {cfg.hidden_size} is not divisible by heads {cfg.heads}")
    hf_cfg = LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.hf.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(hf_cfg)


def corpus_batch(envs: list, tok: ChatTokenizer, rng: random.Random, n: int, loss_on: str):
    """`n` rendered gold episodes from the train split of randomly chosen environments."""
    seqs, masks = [], []
    for _ in range(n):
        env = rng.choice(envs)
        task = env.draw(rng, "train")
        msgs, _ = play(env, task, env.gold_turns(task))
        ids, mask = tok.sft_ids(msgs, tools=env.tools(task))
        seqs.append(ids)
        masks.append([1] * len(ids) if loss_on == "all" else mask)
    return make_batch(seqs, masks, None, tok.pad_token_id)


def pretrain(cfg: NanoConfig, progress: bool = True) -> tuple[torch.nn.Module, ChatTokenizer, dict]:
    """Pre-train from random weights for `cfg.steps` steps; returns model, tokenizer, stats."""
    tok = nano_tokenizer()
    model = build_model(cfg, tok).train()
    envs = [make_env(c.name, **c.options) for c in cfg.corpus for _ in range(c.copies)]
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * s / cfg.steps)).item())
    )
    t0, losses = time.perf_counter(), []
    bar = progress_bar(range(cfg.steps), "pretrain nano", progress)
    for step in bar:
        batch = corpus_batch(envs, tok, rng, cfg.batch_size, cfg.loss_on)
        # Position 0 has no prediction; the first token's mask entry is ignored.
        batch.loss_mask[:, 0] = 0
        loss, m = sft_loss(token_logprobs(model, batch), batch.loss_mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(m["nll"])
        if step % 20 == 0:
            bar.set_postfix(loss=f"{m['nll']:.3f}", refresh=False)
    stats = {"steps": cfg.steps, "seconds": time.perf_counter() - t0,
             "final_loss": sum(losses[-20:]) / len(losses[-20:]),
             "parameters": sum(p.numel() for p in model.parameters())}
    return model.eval(), tok, stats


# Named nano variants (`--model nano-tools`): the default, and one that has also seen the
# tools@v1 environment's gold episodes, enough to call tools sometimes, not reliably.
PRESETS: dict[str, NanoConfig] = {}


def preset(name: str) -> NanoConfig:
    if not PRESETS:
        PRESETS["nano"] = NanoConfig()
        # 400 steps: greedy tools@v1 success 50%, pass@8 94% on 64 held-out tasks. (300 steps
        # gave 9% / 47%, from which GRPO did not learn in 300 steps; see bench/README.md.)
        PRESETS["nano-tools"] = NanoConfig(
            corpus=[CorpusSpec(name="arith"), CorpusSpec(name="tools", options={"version": 1})],
            steps=400, batch_size=32)
    if name not in PRESETS:
        raise ValueError(f"unknown nano preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]


def ensure_nano(cfg: NanoConfig, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Path of the pre-trained nano model for `cfg`, pre-training it only if not cached."""
    from ..checkpoint import save_model

    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / "models" / f"nano-{cfg.key()}"
    if (path / "gymloop.json").exists():
        return path
    model, tok, stats = pretrain(cfg, progress=progress)
    save_model(model, tok, path, extra={"nano_config": cfg.model_dump(), "pretrain": stats})
    return path
