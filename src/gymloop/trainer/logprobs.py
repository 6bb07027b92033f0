"""Token batches for training and the log-probs a model assigns to them."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch

from ..models.routing import routers, routing


@dataclass
class TokenBatch:
    """Right-padded sequences with everything aligned to token positions.

    input_ids [N, L]; attention_mask [N, L] (1 on real tokens); loss_mask [N, L] (1 on
    tokens the model produced, which are the ones trained on); old_logp [N, L] (behaviour
    log-probs of those tokens, 0 elsewhere); routing [N, layers, L, k] or None (MoE router
    replay: the experts each position was routed to when sampled, -1 where none).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logp: torch.Tensor
    routing: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor | slice) -> "TokenBatch":
        return TokenBatch(self.input_ids[rows], self.attention_mask[rows], self.loss_mask[rows],
                          self.old_logp[rows], None if self.routing is None else self.routing[rows])

    def to(self, device: torch.device | str) -> "TokenBatch":
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device),
                          self.loss_mask.to(device), self.old_logp.to(device),
                          None if self.routing is None else self.routing.to(device))

    def trim(self) -> "TokenBatch":
        """Without the padding columns no row needs: [N, L] -> [N, longest row]."""
        width = int(self.attention_mask.sum(-1).max()) if len(self) else 0
        return TokenBatch(self.input_ids[:, :width], self.attention_mask[:, :width],
                          self.loss_mask[:, :width], self.old_logp[:, :width],
                          None if self.routing is None else self.routing[:, :, :width])


def make_batch(seqs: Sequence[Sequence[int]], masks: Sequence[Sequence[int]],
               logps: Sequence[Sequence[float]] | None, pad_id: int) -> TokenBatch:
    """Pad to one width. `masks[i]` and `logps[i]` are aligned with `seqs[i]`."""
    n, width = len(seqs), max(len(s) for s in seqs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    att = torch.zeros((n, width), dtype=torch.long)
    lm = torch.zeros((n, width), dtype=torch.float32)
    old = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        if len(masks[i]) != len(s):
            raise ValueError(f"sequence {i}: mask length {len(masks[i])} != {len(s)} tokens")
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        att[i, : len(s)] = 1
        lm[i, : len(s)] = torch.tensor(masks[i], dtype=torch.float32)
        if logps is not None:
            old[i, : len(s)] = torch.tensor(logps[i], dtype=torch.float32)
    return TokenBatch(ids, att, lm, old)


def token_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """logp [N, L]: log-prob of each token given the ones before it (position 0 gets 0).

    Uses softmax(logits / temperature), the distribution the engine reports for a sample
    drawn at that temperature, so the PPO ratio starts at exactly 1 on fresh rollouts. An MoE
    batch with routing replays it (models/routing.py).
    """
    return logprobs_and_aux(model, batch, temperature)[0]


def logprobs_and_aux(model: torch.nn.Module, batch: TokenBatch,
                     temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp [N, L], the router's load-balancing loss scaled by the model's
    router_aux_loss_coef, a scalar; None for a dense model)."""
    moe = bool(routers(model))
    with routing(model, replay=batch.routing) if moe else contextlib.nullcontext():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    **({"output_router_logits": True} if moe else {}))
    logits = out.logits[:, :-1].float()                            # [N, L-1, V]
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = torch.log_softmax(logits, -1)
    tgt = batch.input_ids[:, 1:, None]                             # [N, L-1, 1]
    lp = logp.gather(-1, tgt).squeeze(-1)                          # [N, L-1]
    aux = getattr(out, "aux_loss", None) if moe else None
    if aux is not None:
        aux = aux * model.config.router_aux_loss_coef
    return torch.nn.functional.pad(lp, (1, 0)), aux                # [N, L]


MIN_SHARED_PREFIX = 8     # shorter shared prefixes are not worth a second forward call


def shared_prefix(batch: TokenBatch) -> int:
    """P: how many leading tokens every row has in common (a chat template's system prompt, a
    DPO pair's prompt), capped so that no trained token is predicted from inside the prefix
    (the token at position t is predicted from position t - 1, so P <= first trained - 1)."""
    same = (batch.input_ids == batch.input_ids[:1]).all(0) & batch.attention_mask.bool().all(0)    # [L]
    run = int(same.long().cumprod(0).sum())
    trained = batch.loss_mask.bool()
    first = int(trained.float().argmax(-1)[trained.any(-1)].min()) if trained.any() else batch.input_ids.shape[1]
    return max(0, min(run, first - 1))


def completion_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """logp [N, L] of the trained tokens (loss_mask 1; other positions 0), the same values as
    token_logprobs with less work: the prefix all rows share runs once (its keys and values
    repeated for every row, gradients flowing back through them), and the vocabulary
    projection runs only at positions that predict a trained token. Without a long shared
    prefix, a Llama-family model runs the engine's native forward (engine/llama.py: the same
    math without the framework's per-call overhead). MoE models (router losses and replay over
    every position) and other models without a shared prefix take the plain path."""
    from ..engine.llama import LlamaBackend, supports

    n, length = batch.input_ids.shape
    p = shared_prefix(batch)
    # position j predicts token j + 1: the positions before a trained token, [K] (all >= p)
    want = batch.loss_mask[:, 1:].bool().any(0).nonzero().squeeze(-1)
    if routers(model) or (p < MIN_SHARED_PREFIX and supports(model) is not None):
        return token_logprobs(model, batch) * batch.loss_mask
    if p < MIN_SHARED_PREFIX:
        logits = LlamaBackend(model).train_logits(batch.input_ids, want)              # [N, K, V]
    else:
        head = model(input_ids=batch.input_ids[:1, :p], attention_mask=batch.attention_mask[:1, :p], use_cache=True)
        cache = head.cache
        cache.batch_repeat_interleave(n)                               # [1, heads, P, d] -> [N, heads, P, d]
        logits = model(input_ids=batch.input_ids[:, p:], attention_mask=batch.attention_mask, cache=cache,
                       use_cache=False, logits_to_keep=want - p).logits               # [N, K, V]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[:, want + 1][..., None]).squeeze(-1)
    full = torch.zeros(n, length, dtype=lp.dtype, device=lp.device)
    full[:, want + 1] = lp                                             # [N, K] back to token positions
    return full * batch.loss_mask
