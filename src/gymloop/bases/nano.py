"""The `nano` model: a small Llama pre-trained locally on the environments' own tasks.

It is the embedded default, as SQLite is for databases: built from nothing in a CPU minute,
cached by the hash of its config, so the whole loop runs on a laptop. The base is deliberately
only modestly accurate (RL from random weights gets no signal at all, while a base that already
solves everything leaves nothing to learn).

Two choices make the base comparable on every machine (docs/guide.md, "Why the base is stopped on a probe"):
- **Stop on a probe band, not a step count.** Learning 2-digit addition is a sudden transition
  whose onset moves by hundreds of steps with the seed and the CPU's float rounding, so a fixed
  budget gives bases of very different skill. Pre-training probes greedy pass@1 on tasks it never
  trains on every `probe_every` steps and stops at the first probe >= `target_pass1`.
- **A constant learning rate after warm-up, no decay.** A base annealed to zero sits in a sharp
  optimum that GRPO's first steps fall out of; one stopped at a constant rate climbs from the start.
"""
from __future__ import annotations

import functools
import hashlib
import json
import random
import time
from pathlib import Path

import torch
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..algorithms.sft import sft_loss
from ..models.chat import ChatTokenizer, build_char_tokenizer, nano_hf_tokenizer, train_nano_tokenizer
from ..envs import make_env, play
from ..models.parameters import count_parameters
from ..trainer.logprobs import logprobs_and_aux, make_batch
from ..trainer.optim import OptimSpec, build_optimizer, optimizer_step
from ..tracking.progress import progress as progress_bar
from ..models.cache import default_cache_dir

# Bump when the pre-training code changes what gets cached (the tokenizer enters the key itself).
RECIPE_VERSION = 4

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


class ProbeSpec(BaseModel):
    """What pre-training measures to decide when to stop: greedy pass@1 on `tasks` train-split
    tasks of an environment, which are left out of the corpus (a validation set: the held-out
    split stays untouched for evaluation)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("arith", description="Environment of the probe (a corpus generator).")
    options: dict = Field(default_factory=dict, description="Its options.")
    tasks: int = Field(200, ge=8, description="Probe tasks (removed from the corpus).")
    max_turns: int = Field(1, ge=1, description="Most model turns per probe episode.")
    max_new_tokens: int = Field(8, ge=1, description="Most tokens per model turn.")


class NanoConfig(BaseModel):
    """Architecture and pre-training recipe of the nano model (all fields enter the cache key)."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = Field(128, ge=16, description="Model width.")
    layers: int = Field(2, ge=1, description="Transformer blocks.")
    heads: int = Field(4, ge=1, description="Attention heads (head_dim = hidden_size / heads).")
    intermediate_size: int = Field(512, ge=16, description="MLP width.")
    max_positions: int = Field(512, ge=32, description="Longest sequence the model supports.")
    experts: int = Field(0, ge=0, description="0: a dense Llama. N >= 2: a Mixtral-style mixture of N "
                         "experts per layer (transformers' MixtralForCausalLM), each intermediate_size wide.")
    experts_per_token: int = Field(2, ge=1, description="Experts the router picks per token (top-k).")
    router_aux_loss_coef: float = Field(0.01, ge=0, description="Weight of the router's load-balancing loss "
                                        "(Switch Transformer) in pre-training and RL.")
    corpus: list[CorpusSpec] = Field(
        default_factory=lambda: [CorpusSpec()],
        description="Task generators whose train split (gold episodes) forms the corpus.",
    )
    loss_on: Literal["all", "assistant"] = Field(
        "assistant", description="Next-token loss on every token, or only on assistant replies (the "
        "transition to a working base comes ~150 steps sooner: the random operands are noise to predict).")
    steps: int = Field(3000, ge=1, description="Most optimizer steps; exactly this many when target_pass1 is None.")
    target_pass1: float | None = Field(
        0.3, gt=0, le=1, description="Stop at the first probe whose greedy pass@1 reaches this (None: "
        "train all `steps`). 0.3 leaves GRPO room to climb on every seed measured.")
    probe: ProbeSpec = Field(default_factory=ProbeSpec, description="The stopping probe.")
    probe_every: int = Field(25, ge=1, description="Optimizer steps between probes.")
    batch_size: int = Field(64, ge=1, description="Sequences per step.")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate after warm-up (3e-3 makes the "
                      "transition so abrupt that a probe every 25 steps overshoots the target).")
    warmup_steps: int = Field(50, ge=0, description="Linear learning-rate warm-up.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="After warm-up: constant (a base RL can move), or cosine to 0 at `steps` "
        "(an annealed base; GRPO's first steps knock it out of its sharp optimum).")
    seed: int = Field(0, description="Seed of initialisation and corpus sampling.")

    @model_validator(mode="after")
    def _probe_in_corpus(self) -> "NanoConfig":
        if self.target_pass1 is not None and self.probe.name not in {c.name for c in self.corpus}:
            raise ValueError(f"probe environment {self.probe.name!r} is not in the corpus "
                             f"({[c.name for c in self.corpus]}): its score could not rise")
        return self

    def key(self) -> str:
        tokenizer = hashlib.sha256(_nano_tokenizer_json().encode()).hexdigest()
        blob = json.dumps({"recipe": RECIPE_VERSION, "tokenizer": tokenizer, **self.model_dump()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


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


def _dense(cfg: NanoConfig, common: dict) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**common))


def _mixtral(cfg: NanoConfig, common: dict) -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    if cfg.experts_per_token > cfg.experts:
        raise ValueError(f"experts_per_token {cfg.experts_per_token} > experts {cfg.experts}")
    return MixtralForCausalLM(MixtralConfig(
        **common, num_local_experts=cfg.experts, num_experts_per_tok=cfg.experts_per_token,
        router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False,
        sliding_window=None))


# the architecture of each kind of nano: dense (experts 0) or a mixture of experts
ARCHITECTURES = {"dense": _dense, "moe": _mixtral}


def build_model(cfg: NanoConfig, tok: ChatTokenizer) -> torch.nn.Module:
    if cfg.hidden_size % cfg.heads:
        raise ValueError(f"hidden_size {cfg.hidden_size} is not divisible by heads {cfg.heads}")
    common = dict(
        vocab_size=tok.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.hf.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    return ARCHITECTURES["moe" if cfg.experts else "dense"](cfg, common)


def corpus_tasks(envs: list, rng: random.Random, n: int, exclude: frozenset[str] = frozenset()) -> list:
    """`n` (environment, task) pairs from the train split of randomly chosen environments, none
    of whose task ids is in `exclude` (the probe's)."""
    out = []
    while len(out) < n:
        env = rng.choice(envs)
        task = env.draw(rng, "train")
        if task.id not in exclude:
            out.append((env, task))
    return out


def corpus_batch(envs: list, tok: ChatTokenizer, rng: random.Random, n: int, loss_on: str,
                 exclude: frozenset[str] = frozenset()):
    """`n` rendered gold episodes of `corpus_tasks`; loss on every token or the assistant's."""
    seqs, masks = [], []
    for env, task in corpus_tasks(envs, rng, n, exclude):
        msgs, _ = play(env, task, env.gold_turns(task))
        ids, mask = tok.sft_ids(msgs, tools=env.tools(task))
        seqs.append(ids)
        masks.append([1] * len(ids) if loss_on == "all" else mask)
    return make_batch(seqs, masks, None, tok.pad_token_id)


def _optim(cfg: NanoConfig) -> OptimSpec:
    decay = cfg.steps if cfg.lr_schedule == "cosine" else None
    return OptimSpec(lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01, warmup_steps=cfg.warmup_steps,
                     decay_steps=decay, min_lr_ratio=0.0)


def probe_score(model: torch.nn.Module, tok: ChatTokenizer, env, tasks: list, spec: ProbeSpec) -> float:
    """Greedy pass@1 of `model` on the probe tasks (the model is left in eval mode)."""
    from ..engine.factory import EngineSpec, make_engine
    from ..rollout.evaluate import evaluate

    model.eval()
    engine = make_engine(EngineSpec(), model, tok)
    return evaluate(engine, tok, env, tasks, max_new_tokens=spec.max_new_tokens, max_turns=spec.max_turns).pass1


def pretrain(cfg: NanoConfig, progress: bool = True) -> tuple[torch.nn.Module, ChatTokenizer, dict]:
    """Pre-train from random weights until the probe reaches `cfg.target_pass1` (or for
    `cfg.steps` steps); returns model, tokenizer, stats (steps run, the probe curve)."""
    tok = nano_tokenizer()
    model = build_model(cfg, tok).train()
    envs = [make_env(c.name, **c.options) for c in cfg.corpus for _ in range(c.copies)]
    probe_env = make_env(cfg.probe.name, **cfg.probe.options)
    probe_tasks = probe_env.sample_tasks(cfg.probe.tasks, "train", seed=cfg.seed + 7_919)
    exclude = frozenset(t.id for t in probe_tasks) if cfg.target_pass1 is not None else frozenset()
    rng = random.Random(cfg.seed)
    opt, sched = build_optimizer(model.parameters(), _optim(cfg))
    t0, losses, curve = time.perf_counter(), [], []
    bar = progress_bar(range(1, cfg.steps + 1), "pretrain nano", progress)
    step = 0
    for step in bar:
        batch = corpus_batch(envs, tok, rng, cfg.batch_size, cfg.loss_on, exclude)
        # Position 0 has no prediction; the first token's mask entry is ignored.
        batch.loss_mask[:, 0] = 0
        logp, aux = logprobs_and_aux(model, batch)
        loss, m = sft_loss(logp, batch.loss_mask)
        if aux is not None:          # MoE: keep the experts in use (load balancing)
            loss = loss + aux
        optimizer_step(model, opt, sched, loss, 1.0)
        losses.append(m["nll"])
        if cfg.target_pass1 is not None and step % cfg.probe_every == 0:
            score = probe_score(model, tok, probe_env, probe_tasks, cfg.probe)
            model.train()
            curve.append({"step": step, "pass1": score})
            bar.set_postfix(loss=f"{m['nll']:.3f}", probe=f"{score:.2f}", refresh=False)
            if score >= cfg.target_pass1:
                break
        elif step % 20 == 0:
            bar.set_postfix(loss=f"{m['nll']:.3f}", refresh=False)
    bar.close()
    final = curve[-1]["pass1"] if curve else None
    stats = {"steps": step, "seconds": time.perf_counter() - t0,
             "final_loss": sum(losses[-20:]) / len(losses[-20:]),
             **dict(zip(("parameters", "active_parameters"), count_parameters(model))),
             "seed": cfg.seed, "target_pass1": cfg.target_pass1, "probe_pass1": final,
             "target_reached": None if cfg.target_pass1 is None else final is not None and final >= cfg.target_pass1,
             "probe_curve": curve}
    return model.eval(), tok, stats


def _nano_tools() -> NanoConfig:
    """nano that has also seen tool-use transcripts whose prompts do not list the tools: of tools@v1
    (60%) and of tools@v3 (40%: renamed tools and arguments). It calls v1 greedily and still
    samples whole, correct v3 episodes now and then at temperature 0.7, which is what GRPO
    recovers from after the API changes (the demo's loop chapter; fewer v3 transcripts left too
    few such samples to learn from, docs/measurements.md). Stops once it solves 80% of the
    tools@v1 probe."""
    v1, v3 = {"version": 1, "schemas": False}, {"version": 3, "schemas": False}
    return NanoConfig(corpus=[CorpusSpec(name="arith", copies=10), CorpusSpec(name="tools", options=v1, copies=6),
                              CorpusSpec(name="tools", options=v3, copies=4)],
                      probe=ProbeSpec(name="tools", options=v1, tasks=48, max_turns=3, max_new_tokens=40),
                      target_pass1=0.8, batch_size=32)


def _nano_moe() -> NanoConfig:
    """nano as a mixture of experts (Mixtral-style: 4 experts of width 256 per layer, top-2), so
    a token passes through as many MLP parameters as in dense nano (2 x 256 = 512) while the
    model holds twice as many; same corpus, probe and stopping band as nano."""
    return NanoConfig(experts=4, experts_per_token=2, intermediate_size=256)


# Named nano variants (`--model nano-tools`): name -> the recipe (a function, so nothing is
# shared or filled in lazily).
PRESETS: dict[str, Callable[[], NanoConfig]] = {"nano": NanoConfig, "nano-tools": _nano_tools,
                                                "nano-moe": _nano_moe}


def preset(name: str, **overrides) -> NanoConfig:
    """The recipe of a named nano variant, with fields replaced (e.g. `seed=1`), validated."""
    if name not in PRESETS:
        raise ValueError(f"unknown nano preset {name!r}; known: {sorted(PRESETS)}")
    return NanoConfig.model_validate({**PRESETS[name]().model_dump(), **overrides})


def ensure_nano(cfg: NanoConfig, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Path of the pre-trained nano model for `cfg`, pre-training it only if not cached."""
    from ..models.checkpoint import save_model

    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / "models" / f"nano-{cfg.key()}"
    if (path / "gymloop.json").exists():
        return path
    model, tok, stats = pretrain(cfg, progress=progress)
    save_model(model, tok, path, extra={"nano_config": cfg.model_dump(), "pretrain": stats})
    return path
