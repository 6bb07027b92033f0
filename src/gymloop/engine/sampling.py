"""Sampling parameters, the per-step token sampler, and the generation loop over a backend."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch.

    `temperature=0` is greedy. Reported log-probs are under softmax(logits / temperature)
    *before* top-p truncation: the distribution a trainer can recompute from a forward pass
    (with the default `top_p=1` it is exactly the sampling distribution).
    """

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0      # also report the k most likely tokens at each step (0: none)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")


@dataclass
class Generation:
    """One sampled completion: ids, their log-probs, and why it ended ("stop" or "length").
    `top_logprobs[t]`: the (token id, log-prob) pairs of the k most likely tokens at step t, when
    asked for (SamplingParams.top_logprobs), under the same distribution as `logprobs`.
    `routing`: for an MoE model whose engine records routing, the experts every position of
    prompt + completion (but the last token) was routed to (models/routing.py)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    routing: "torch.Tensor | None" = None   # MoE: experts per position [layers, P + n - 1, k] (router replay)


@dataclass
class GenerationBatch:
    generations: list[Generation]
    prompt_tokens: int
    generated_tokens: int
    seconds: float
    version: int
    stats: dict = field(default_factory=dict)


class Backend(Protocol):
    """A model's forward pass with a KV cache, on token ids.

    start: ids [B, P] left-padded, mask [B, P] (True on real tokens) -> logits [B, V]
    step:  tok [B] (the previous sampled token of each live row) -> logits [B, V]
    keep:  rows [B'] indices of rows to keep (drop finished ones from the cache)
    """

    can_compact: bool
    device: torch.device          # where start/step expect their inputs

    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor: ...
    def step(self, tok: torch.Tensor) -> torch.Tensor: ...
    def keep(self, rows: torch.Tensor) -> None: ...


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None, top_k: int = 0):
    """Draw one token per row.

    logits: [B, V] float. Returns tok [B] int64, logp [B] float32 (the log-prob of `tok` under
    softmax(logits / temperature), temperature 1 when greedy) and, with `top_k` > 0, the k most
    likely tokens and their log-probs under that distribution, (ids [B, k], logp [B, k]), else None.
    """
    logits = logits.float()
    logp = torch.log_softmax(logits / (temperature or 1.0), -1)    # [B, V]
    top = logp.topk(top_k, -1) if top_k else None
    if temperature == 0:
        tok = logits.argmax(-1)                                    # [B]
        picked = logp.gather(-1, tok[:, None]).squeeze(-1)
        return tok, picked, top and (top.indices, top.values)
    probs = logp.exp()
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)                   # [B, V]
        drop = sp.cumsum(-1) - sp > top_p                          # keep the nucleus
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
    tok = draw(probs, generator)                                   # [B]
    picked = logp.gather(-1, tok[:, None]).squeeze(-1)
    return tok, picked, top and (top.indices, top.values)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [B, V] (rows may hold zeros; need not sum to 1) -> [B] int64,
    by inverting the cumulative distribution at one uniform number per row. torch.multinomial
    draws an exponential number per vocabulary entry instead (B x V of them: 40 ms a step at
    B=32, V=49152 on a 2-core CPU, a fifth of a SmolLM2 group's generation; this takes ~6 ms).
    The sums are float64, so a token's chance is off by ~1e-12 at most, and a zero-probability
    token (top-p) is never drawn: its interval is empty."""
    cdf = probs.double().cumsum(-1)                                # [B, V]
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)     # [B, 1]: first entry above u
    return tok.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, P] and mask [B, P] on `device`, with prompts right-aligned (left padding)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = True
    return ids.to(device), mask.to(device)


def _hits_stop(tokens: list[int], stops: tuple[str, ...], decode: Callable[[list[int]], str],
               window: int) -> bool:
    tail = decode(tokens[-window:])
    return any(s in tail for s in stops)


def run_generation(backend: Backend, prompts: Sequence[Sequence[int]], params: SamplingParams,
                   pad_id: int, generator: torch.Generator | None,
                   decode: Callable[[list[int]], str] | None = None,
                   compact_fraction: float = 0.25,
                   on_token: Callable[[int, int], None] | None = None) -> list[Generation]:
    """The engine's sampling loop: prefill, then one token per live row per step.

    Finished rows are dropped from the backend's cache once `compact_fraction` of the live
    rows have finished, so a batch with uneven lengths does not pay for its longest member
    in every row. `on_token(prompt_index, token_id)` is called for every sampled token (streaming).
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if params.stop and decode is None:
        raise ValueError("stop strings need an engine built with a tokenizer")
    stop_ids = set(params.stop_token_ids)
    window = max((len(s) for s in params.stop), default=0) + 2
    outs = [Generation([], [], "length") for _ in prompts]
    live = list(range(len(prompts)))        # original index of each backend row
    done_in_cache: list[int] = []           # backend rows that finished but still occupy cache
    device = generator.device if generator is not None else backend.device
    ids, mask = left_pad(prompts, pad_id, device)
    logits = backend.start(ids, mask, params.max_new_tokens)
    for step in range(params.max_new_tokens):
        tok, logp, top = sample_next(logits, params.temperature, params.top_p, generator, params.top_logprobs)
        tops = None if top is None else [list(zip(i, v)) for i, v in zip(top[0].tolist(), top[1].tolist())]
        for row, (t, lp) in enumerate(zip(tok.tolist(), logp.tolist())):
            g = outs[live[row]]
            if g.finish_reason == "stop":
                continue
            g.token_ids.append(t)
            g.logprobs.append(lp)
            if tops is not None:
                g.top_logprobs.append(tops[row])
            if on_token is not None:
                on_token(live[row], t)
            if t in stop_ids or (params.stop and _hits_stop(g.token_ids, params.stop, decode, window)):
                g.finish_reason = "stop"
                done_in_cache.append(row)
        if len(done_in_cache) == len(live) or step == params.max_new_tokens - 1:
            break
        if backend.can_compact and len(done_in_cache) >= compact_fraction * len(live):
            gone = set(done_in_cache)
            rows = [r for r in range(len(live)) if r not in gone]
            backend.keep(torch.tensor(rows, dtype=torch.long, device=device))
            live = [live[r] for r in rows]
            tok = tok[rows]
            done_in_cache = []
        logits = backend.step(tok)
    return outs
