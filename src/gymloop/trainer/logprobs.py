"""Token batches for training and the log-probs a model assigns to them."""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import torch

from ..models.routing import routers, routing
from .layer import decoder_layer


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


# shorter common prefixes are not worth running apart (a 1-token head made nano SFT steps ~15% slower:
# its own small kernels, and an explicit mask where rows were plain causal)
MIN_SHARED_PREFIX = 8


@dataclass
class Rows:
    """A batch's rows as Python lists, read from its tensors once: what shared_prefix and
    pack_rows decide is bookkeeping on a few hundred integers, which list operations do in a
    fraction of the time of the ~60 small tensor operations they replaced (6% of a nano SFT
    step). ids: each row's real tokens (no padding); trained: each row's positions whose
    loss_mask is not 0, ascending."""

    ids: list[list[int]]
    trained: list[list[int]]
    width: int                                                            # L, the batch's width

    @classmethod
    def of(cls, batch: TokenBatch) -> "Rows":
        real = batch.attention_mask.sum(-1).tolist()
        ids = [r[:n] for r, n in zip(batch.input_ids.tolist(), real)]
        trained = [[t for t, m in enumerate(row) if m] for row in batch.loss_mask.tolist()]
        return cls(ids, trained, batch.input_ids.shape[1])

    def shared_prefix(self) -> int:
        """See shared_prefix."""
        run = 0
        for column in zip(*self.ids):                                     # positions where every row is real
            if column.count(column[0]) != len(column):
                break
            run += 1
        first = min((t[0] for t in self.trained if t), default=self.width)
        return max(0, min(run, first - 1))


def shared_prefix(batch: TokenBatch) -> int:
    """P: how many leading tokens every row has in common (a chat template's system prompt, a
    DPO pair's prompt), capped so that no trained token is predicted from inside the prefix
    (the token at position t is predicted from position t - 1, so P <= first trained - 1)."""
    return Rows.of(batch).shared_prefix()


@dataclass
class PackedRows:
    """A batch packed for the native training forward (engine/llama.LlamaBackend.packed_logits).
    The first `head` tokens, when every row has them (a system prompt, the chat template's
    header), run once for the whole batch, every row seeing them. Of the rest, rows that share
    their tokens up to the position that predicts their first trained token (a DPO pair's
    prompt) become one packed row: the shared part once, then each row's rest, each rest seeing
    the shared part and itself only. Other rows stay as they are. Every row ends at the token
    that predicts its last trained token (what comes after feeds nothing trained).

    head [P] (P may be 0); ids, pos [R, T] (pos: a token's position in its own sequence, from P);
    mask [R, T, T] bool over the rows' tokens (the head is seen by all), or None when nothing was
    shared (plain causal rows); sel [R, U]: the packed positions that predict a trained token
    (repeated to width U); for each trained token [K]: its batch row and position (row, col) and
    where its prediction is in sel (at_row, at_u)."""

    head: torch.Tensor
    ids: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor | None
    sel: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    at_row: torch.Tensor
    at_u: torch.Tensor

    def to(self, device: torch.device | str) -> "PackedRows":
        return PackedRows(*(None if t is None else t.to(device) for t in (
            self.head, self.ids, self.pos, self.mask, self.sel, self.row, self.col, self.at_row, self.at_u)))


def pack_rows(batch: TokenBatch, pad_id: int = 0, head: int = 0, rows: Rows | None = None) -> PackedRows:
    """The batch as PackedRows, its first `head` tokens (common to every row, none of them
    trained; shared_prefix) run once; built on the CPU. `rows`: the batch's Rows when the caller
    has them."""
    rows = rows or Rows.of(batch)
    input_ids = batch.input_ids.cpu()
    n = len(rows.ids)
    # from here on, positions after the head: position j predicts token head + 1 + j
    tj = [[t - head - 1 for t in tr if t > head] for tr in rows.trained]
    ids = [r[head:] for r in rows.ids]
    first = [t[0] if t else 0 for t in tj]
    # a row's tokens after the one that predicts its last trained token feed nothing trained
    # (a causal model: nothing before them reads them): they are left out
    lens = [t[-1] + 1 if t else 0 for t in tj]
    prefixes = [tuple(r[:s]) for r, s in zip(ids, first)]
    count = Counter(prefixes)
    groups: dict[tuple, list[int]] = {}
    for m, key in enumerate(prefixes):
        # a prefix no other row has stays in its row (key: the row alone)
        groups.setdefault(key if count[key] > 1 else (-1, m), []).append(m)
    r = torch.tensor([m for m, t in enumerate(tj) for _ in t], dtype=torch.long)      # [K]: each trained token's row
    j = torch.tensor([x for t in tj for x in t], dtype=torch.long)                    # and the position predicting it
    top = input_ids[0, :head]
    if len(groups) == n:                                                  # nothing shared: the batch as it is
        # the trained positions are distinct and in order: each one's place in its row is a count
        u = max(1, max(map(len, tj)))
        sel = torch.tensor([t + [0] * (u - len(t)) for t in tj], dtype=torch.long)
        at_u = torch.tensor([k for t in tj for k in range(len(t))], dtype=torch.long)
        width = max(max(lens), 1)
        return PackedRows(top, input_ids[:, head:head + width], torch.arange(head, head + width).expand(n, width),
                          None, sel, r, j + 1 + head, r, at_u)
    # shift[m]: position t (after the head) of row m is position t + shift[m] of packed row home[m]
    tokens, positions, segments, home, shift = [], [], [], [0] * n, [0] * n
    for g, members in enumerate(groups.values()):
        s = first[members[0]] if len(members) > 1 else 0
        tok, pos, seg = ids[members[0]][:s], list(range(head, head + s)), [0] * s
        for k, m in enumerate(members, 1):
            home[m], shift[m] = g, len(tok) - s
            tok = tok + ids[m][s:lens[m]]
            pos, seg = pos + list(range(head + s, head + lens[m])), seg + [k] * (lens[m] - s)
        tokens.append(tok), positions.append(pos), segments.append(seg)
    width = max(map(len, tokens))
    pad = lambda rows, v: torch.tensor([r + [v] * (width - len(r)) for r in rows], dtype=torch.long)  # noqa: E731
    packed_ids, pos, seg = pad(tokens, pad_id), pad(positions, 0), pad(segments, -1)
    sq, sk = seg[:, :, None], seg[:, None, :]                             # [R, T, 1], [R, 1, T]
    # a rest sees the shared part (segment 0) and its own earlier tokens; a padding query sees
    # itself, so no softmax row is empty
    mask = (torch.ones(width, width, dtype=torch.bool).tril() & (sk >= 0) & ((sk == 0) | (sk == sq))) \
        | torch.eye(width, dtype=torch.bool)
    at_row = torch.tensor(home)[r]
    packed_col = j + torch.tensor(shift)[r]
    sel, at_u = _selected(at_row, packed_col, len(groups))
    return PackedRows(top, packed_ids, pos, mask, sel, r, j + 1 + head, at_row, at_u)


def _selected(row: torch.Tensor, col: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sel [R, U]: each row's distinct columns, in order, padded with column 0; at [K]: where
    (row[k], col[k]) is in its row of sel)."""
    width = int(col.max()) + 1 if len(col) else 1
    uniq, inverse = torch.unique(row * width + col, return_inverse=True)  # sorted by row, then column
    urow, ucol = uniq // width, uniq % width
    per_row = torch.bincount(urow, minlength=n_rows)
    start = torch.cumsum(per_row, 0) - per_row                            # [R]
    rank = torch.arange(len(uniq)) - start[urow]                          # a column's place in its row
    sel = torch.zeros(n_rows, max(int(per_row.max()) if n_rows else 0, 1), dtype=torch.long)
    sel[urow, rank] = ucol
    return sel, rank[inverse]


class CompletionLogprobs:
    """completion_logprobs for one model whose modules stay the ones it was built on (a
    training job's, whose weights change in place): which path the model takes and its native
    backend are found once instead of every step (finding MoE routers walks every module)."""

    def __init__(self, model: torch.nn.Module) -> None:
        from ..engine.llama import LlamaBackend, supports

        from .sharding import is_sharded

        self.model = model
        self.moe = bool(routers(model))
        # a sharded model's (FSDP) parameters are DTensors, gathered by hooks on its own forward
        self.plain = self.moe or is_sharded(model)
        self.native = LlamaBackend(model) if not self.plain and supports(model) is None else None

    def __call__(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        """logp [N, L] of the trained tokens (loss_mask 1; other positions 0), the same values
        as token_logprobs (at `temperature`) with less work. A Llama-family model runs the
        engine's native forward on packed rows (pack_rows): a prefix common to the whole batch
        (a system prompt) once, a GRPO group's prompt once for its samples and a DPO pair's once
        for both answers, no token after a row's last trained one, and a last layer that computes
        only what the trained tokens read. Other models run a long common prefix once through
        their own forward (its keys and values repeated for every row, gradients flowing back
        through them). Both project onto the vocabulary only the positions that predict a trained
        token. MoE models (router losses and replay over every position), sharded ones (FSDP) and
        other models without a long common prefix take the plain path."""
        model = self.model
        n, length = batch.input_ids.shape
        rows = Rows.of(batch)
        p = rows.shared_prefix()
        if self.plain or (p < MIN_SHARED_PREFIX and self.native is None):
            return token_logprobs(model, batch, temperature) * batch.loss_mask
        t = temperature if temperature not in (0.0, 1.0) else 1.0
        full = torch.zeros(n, length, dtype=torch.float32, device=batch.input_ids.device)
        if self.native is not None:
            k = pack_rows(batch, head=p if p >= MIN_SHARED_PREFIX else 0, rows=rows).to(batch.input_ids.device)
            logits = self.native.packed_logits(k.head, k.ids, k.pos, k.mask, k.sel, decoder_layer)[k.at_row, k.at_u]   # [K, V]
            full[k.row, k.col] = torch.log_softmax(logits.float() / t, -1).gather(-1, batch.input_ids[k.row, k.col][:, None]).squeeze(-1)
            return full * batch.loss_mask
        # position j predicts token j + 1: the positions before a trained token, [K] (all >= p)
        want = batch.loss_mask[:, 1:].bool().any(0).nonzero().squeeze(-1)
        head = model(input_ids=batch.input_ids[:1, :p], attention_mask=batch.attention_mask[:1, :p], use_cache=True)
        cache = head.cache
        cache.batch_repeat_interleave(n)                               # [1, heads, P, d] -> [N, heads, P, d]
        logits = model(input_ids=batch.input_ids[:, p:], attention_mask=batch.attention_mask, cache=cache,
                       use_cache=False, logits_to_keep=want - p).logits               # [N, K, V]
        lp = torch.log_softmax(logits.float() / t, -1).gather(-1, batch.input_ids[:, want + 1][..., None]).squeeze(-1)
        full[:, want + 1] = lp                                         # [N, K] back to token positions
        return full * batch.loss_mask


def completion_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """logp [N, L] of the trained tokens (CompletionLogprobs, built for this one call)."""
    return CompletionLogprobs(model)(batch)


def scorer_of(model: torch.nn.Module) -> CompletionLogprobs:
    """The model's CompletionLogprobs, built on its first use and kept on the model: an objective
    made anew every step (GRPO's, with that step's advantages, possibly unpickled in a Ray
    trainer) finds the one built for the trainer's model instead of walking its modules again.
    Kept in the model's __dict__ (not a parameter or buffer: no state_dict sees it); a weak-keyed
    table would never drop it, its value holding the model."""
    score = model.__dict__.get("_completion_logprobs")
    if score is None or score.model is not model:
        score = model.__dict__["_completion_logprobs"] = CompletionLogprobs(model)
    return score
