"""Native decode path for Llama-family models (Llama, SmolLM2, Qwen2-style q/k/v bias).

A Hugging Face `generate` step spends most of its time in Python around small kernels; this
backend runs the same math on the model's own parameter tensors (read by reference, so a
weight update is visible without copying) with a preallocated KV cache and a precomputed
rotary table. `supports()` says why a model cannot use it; such models use the HF backend.

With a compute dtype other than the parameters' (`dtype=torch.bfloat16` on float32 weights), the
backend holds cast copies, made again by `refresh()` (which every weight load calls): on a CPU
with AMX, SmolLM2's greedy evaluation of tool-call requests (~360-token prompts, prefill most of
it) ran 3.0x faster, with the same score (bench/results/engines/dtype/). Logits come back in
float32 either way.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from ..models.lora import is_lora, linear_weights, native_blocker
from .gemm import linear
from .ops import Shape, additive_mask, merge_heads, rope, split_heads

SUPPORTED_TYPES = ("llama", "qwen2")


def _rope_theta(cfg) -> tuple[float, str]:
    params = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return float(theta), kind


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first [U], inverse [B]): the first row of each distinct (ids, mask) row of [B, P], in
    order of first appearance, and which of them each row is (rows == first[inverse])."""
    _, group = torch.unique(torch.cat((ids, mask.long()), -1), dim=0, return_inverse=True)   # [B]
    B = len(ids)
    first_of = torch.full((int(group.max()) + 1,), B, dtype=torch.long, device=ids.device)
    first_of.scatter_reduce_(0, group, torch.arange(B, device=ids.device), "amin")       # group -> its first row
    first = torch.sort(first_of).values                                                  # [U], ascending
    rank = torch.empty_like(first_of)
    rank[torch.argsort(first_of)] = torch.arange(len(first_of), device=ids.device)
    return first, rank[group]


def supports(model: torch.nn.Module) -> str | None:
    """None if the native path computes exactly what the model's forward does, else why not."""
    why = native_blocker(model)
    if why:
        return why
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return f"model_type {getattr(cfg, 'model_type', None)!r} not in {SUPPORTED_TYPES}"
    if _rope_theta(cfg)[1] != "default":
        return f"rope type {_rope_theta(cfg)[1]!r} is not implemented natively"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} is not silu"
    if getattr(cfg, "mlp_bias", False):
        return "mlp bias is not implemented natively"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention is not implemented natively"
    return None


class LlamaBackend:
    can_compact = True

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        """dtype: the compute dtype (None: the parameters' own, read by reference)."""
        why = supports(model)
        if why:
            raise ValueError(f"native Llama backend cannot run this model: {why}")
        cfg = model.config
        self.model = model
        self.lora = is_lora(model)           # projections are base + adapters (models/lora.linear_weights)
        self.dtype = dtype or next(model.parameters()).dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        theta, _ = _rope_theta(cfg)
        d = self.head_dim
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))  # [D/2]
        self._cos = self._sin = torch.empty(0)
        self.refresh()

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def _in_dtype(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """The parameter itself when it is in the compute dtype, else a cast copy (no grad)."""
        if t is None or t.dtype == self.dtype:
            return t
        with torch.no_grad():
            return t.detach().to(self.dtype)

    def refresh(self) -> None:
        """Re-read parameter references (after the model's tensors were replaced or updated;
        in another compute dtype, cast them again; with LoRA adapters, merge them again)."""
        m, c = self.model, self._in_dtype
        inp, out = m.get_input_embeddings().weight, m.get_output_embeddings().weight
        self.embed = c(inp)                                          # [V, H]
        self.lm_head = self.embed if out is inp else c(out)          # [V, H]; tied: one copy
        self.final_norm = c(m.get_decoder().norm.weight)
        with torch.no_grad():
            self.layers = [tuple(c(t) for t in w) for w in self._layer_weights()]

    def _layer_weights(self) -> list[tuple]:
        """Each decoder layer's weights (n1, Wq, bq, Wk, bk, Wv, bv, Wo, n2, Wg, Wu, Wd), in the
        parameters' dtype: references to the parameters, or with LoRA the merged products
        (differentiable in the adapters where grad is enabled)."""
        out = []
        for layer in self.model.get_decoder().layers:
            a, mlp = layer.self_attn, layer.mlp
            (wq, bq), (wk, bk), (wv, bv) = (linear_weights(p) for p in (a.q_proj, a.k_proj, a.v_proj))
            out.append((layer.input_layernorm.weight, wq, bq, wk, bk, wv, bv, linear_weights(a.o_proj)[0],
                        layer.post_attention_layernorm.weight,
                        *(linear_weights(p)[0] for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))))
        return out

    # --- rotary table ---------------------------------------------------------------
    def _rope_table(self, n: int) -> None:
        if self._cos.shape[0] >= n and self._cos.device == self.device:
            return
        n = max(n, 2 * self._cos.shape[0], 64)
        f = (torch.arange(n, dtype=torch.float32)[:, None] * self.inv_freq).to(self.device)   # [n, D/2]
        # sin with the first half negated: what rope (engine/ops.py) multiplies the rolled x by
        self._cos, self._sin = torch.cat([f.cos(), f.cos()], -1), torch.cat([-f.sin(), f.sin()], -1)   # [n, D]

    # --- forward ----------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, attend) -> torch.Tensor:
        """ids/pos [B, T] -> logits of the last position, [B, V], float32; `attend(layer, q, k,
        v)` is the attention (and writes the cache)."""
        x = self._norm(self._layers(ids, pos, attend)[:, -1], self.final_norm)
        return linear(x, self.lm_head).float()                  # [B, V]

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def _q(self, h: torch.Tensor, w: tuple, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Normed hidden states h [B, T, H*D] -> rotated queries [B, H, T, D] (cos/sin
        broadcastable to [B, 1, T, D])."""
        return rope(split_heads(linear(h, w[1], w[2]), self.n_heads), cos, sin)

    def _kv(self, h: torch.Tensor, w: tuple, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, T, H*D] -> rotated keys and values, [B, KV, T, D] each."""
        return rope(split_heads(linear(h, w[3], w[4]), self.n_kv), cos, sin), split_heads(linear(h, w[5], w[6]), self.n_kv)

    def _out_mlp(self, x: torch.Tensor, o: torch.Tensor, w: tuple) -> torch.Tensor:
        """The rest of a layer: the attention output o [B, H, T, D] projected onto the residual
        stream x [B, T, H*D], then the MLP's residual. Returns [B, T, H*D]."""
        wo, n2, wg, wu, wd = w[7:]
        x = x + linear(merge_heads(o), wo)
        h = self._norm(x, n2)
        return x + linear(F.silu(linear(h, wg)) * linear(h, wu), wd)

    def _attention(self, q, k, v, mask=None, causal=False) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              scale=1.0 / math.sqrt(self.head_dim), enable_gqa=self.n_kv != self.n_heads)

    def _layers(self, ids: torch.Tensor, pos: torch.Tensor, attend) -> torch.Tensor:
        """The decoder stack on ids/pos [B, T] -> hidden states [B, T, H*D] before the final norm;
        `attend(layer, q, k, v)` -> [B, H, T, D] is the attention (the cached decode's)."""
        dtype = self.embed.dtype
        x = F.embedding(ids, self.embed)                          # [B, T, H*D]
        cos = self._cos[pos].to(dtype)[:, None]                   # [B, 1, T, D]
        sin = self._sin[pos].to(dtype)[:, None]
        for i, w in enumerate(self.layers):
            h = self._norm(x, w[0])
            x = self._out_mlp(x, attend(i, self._q(h, w, cos, sin), *self._kv(h, w, cos, sin)), w)
        return x

    def packed_logits(self, head: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                      sel: torch.Tensor, decoder_layer: Callable) -> torch.Tensor:
        """Training's forward on packed rows (trainer/logprobs.pack_rows), each layer run by
        `decoder_layer` (the trainer's, trainer/layer.py: its backward written out; the head's own
        layers by autograd): head [P]
        the tokens every row starts with (positions 0..P-1; P may be 0), run once, their keys and
        values every row's first P; ids and pos [R, T] the rows' own tokens (pos: each token's
        position in its own sequence), mask [R, T, T] bool (which of the rows' keys each query
        sees; None: plain causal rows, right-padded), sel [R, U] (the positions whose logits are
        returned). The last layer computes only what those logits read: keys and values
        everywhere, queries, attention and MLP at sel. Returns [R, U, V]."""
        R, T = ids.shape
        P, dev, dtype = head.shape[0], ids.device, self.embed.dtype
        self._rope_table(max(int(pos.max()) + 1, P))
        cos, sin = self._cos[pos].to(dtype)[:, None], self._sin[pos].to(dtype)[:, None]   # [R, 1, T, D]
        rows = torch.arange(R, device=dev)[:, None]                                # [R, 1]
        x = F.embedding(ids, self.embed)                                           # [R, T, H*D]
        seen = mask                                                                # [R, T, P + T] or None: causal
        if P:
            own = torch.ones(T, T, dtype=torch.bool, device=dev).tril().expand(R, T, T) if mask is None else mask
            seen = torch.cat((torch.ones(R, T, P, dtype=torch.bool, device=dev), own), -1)
            xh = F.embedding(head, self.embed)[None]                               # [1, P, H*D]
            ch, sh = self._cos[:P].to(dtype)[None, None], self._sin[:P].to(dtype)[None, None]   # [1, 1, P, D]
        # the adapters change at every optimizer step: merged afresh, in the gradient's path
        layers = self._layer_weights() if self.lora else self.layers
        last = len(layers) - 1
        shape = Shape(self.n_heads, self.n_kv, self.head_dim, self.eps)
        every = None if seen is None else additive_mask(seen[:, None], dtype)                 # [R, 1, T, P + T]
        at = (torch.arange(T, device=dev) <= sel[..., None]) if seen is None else seen[rows, sel]   # [R, U, P + T]
        for i, w in enumerate(layers):
            kv = None
            if P:                                                                  # the prefix's keys, values and
                hh = self._norm(xh, w[0])                                          # own layer (one row)
                kv = self._kv(hh, w, ch, sh)                                       # [1, KV, P, D] each
                if i < last:                                                       # the last layer reads only its keys
                    xh = self._out_mlp(xh, self._attention(self._q(hh, w, ch, sh), *kv, causal=True), w)
            if i < last:
                x = decoder_layer(x, cos, sin, every, None, kv, shape, w)         # [R, T, H*D]
            else:
                x = decoder_layer(x, cos, sin, additive_mask(at[:, None], dtype), sel, kv, shape, w)   # [R, U, H*D]
        return linear(self._norm(x, self.final_norm), self.lm_head)             # [R, U, V]

    # --- the generation cache ----------------------------------------------------------
    # Two caches: the prompts' keys and values, one row per distinct prompt ([L, U, KV, P, D]:
    # a GRPO group's samples share theirs), and each row's own generated tokens' ([L, B, KV, N,
    # D], N = max_new_tokens). A decode step attends over both (cascade_attention); dropping
    # finished rows (keep) touches only the second and the rows' bookkeeping.

    @torch.inference_mode()
    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Prefill ids [B, P] (mask [B, P]: real tokens) with room for max_new_tokens more; the
        next-token logits [B, V]. Copies of one prompt are prefilled once: with a ~350-token
        prompt and a few dozen new tokens, prefill is most of a group's generation."""
        self._rope_table(ids.shape[1] + max_new_tokens)
        first, inverse = distinct_rows(ids, mask)
        logits = self._prefill(ids[first], mask[first])                     # [U, V]
        B, L, dev = len(ids), len(self.layers), ids.device
        self.k = torch.zeros(L, B, self.n_kv, max_new_tokens, self.head_dim, dtype=self.embed.dtype, device=dev)
        self.v = torch.zeros_like(self.k)
        self.seen = torch.zeros(B, max_new_tokens, dtype=torch.bool, device=dev)    # generated slots written
        self.next_pos = mask.long().sum(-1)                                 # [B]
        self.t = 0
        self._rows(inverse)
        return logits[inverse]

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The prompts' cache from ids, mask [U, P]; their next-token logits [U, V]."""
        U, P = ids.shape
        L, dev = len(self.layers), ids.device
        self.pk = torch.zeros(L, U, self.n_kv, P, self.head_dim, dtype=self.embed.dtype, device=dev)
        self.pv = torch.zeros_like(self.pk)
        self.pseen = mask
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)           # [U, P] real-token positions
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        # A padding query sees only itself, so no softmax row is empty (which would be NaN).
        attn = ((causal & mask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=dev))[:, None]   # [U, 1, P, P]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.pk[i], self.pv[i] = k, v
            return self._attention(q, k, v, attn)
        return self._forward(ids, pos, attend)

    def _rows(self, group: torch.Tensor) -> None:
        """Which prompt each row continues (group [B]) and its place among that prompt's rows."""
        self.group = group
        self.member, self.width = members(group, self.pk.shape[1])

    @torch.inference_mode()
    def step(self, tok: torch.Tensor) -> torch.Tensor:
        t = self.t
        self.seen[:, t] = True
        scale = 1.0 / math.sqrt(self.head_dim)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[i, :, :, t:t + 1], self.v[i, :, :, t:t + 1] = k, v
            return cascade_attention(q, self.pk[i], self.pv[i], self.pseen, self.group, self.member, self.width,
                                     self.k[i], self.v[i], self.seen, scale)
        logits = self._forward(tok[:, None], self.next_pos[:, None], attend)
        self.next_pos += 1
        self.t = t + 1
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        self.k = self.k[:, rows]
        self.v = self.v[:, rows]
        self.seen = self.seen[rows]
        self.next_pos = self.next_pos[rows]
        self._rows(self.group[rows])


def members(group: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, int]:
    """(member [B], width): each row's place among the rows of its group (group [B], values
    < n_groups), in row order, and the most rows any group has."""
    order = torch.argsort(group, stable=True)
    counts = torch.bincount(group, minlength=n_groups)
    starts = torch.cumsum(counts, 0) - counts
    member = torch.empty_like(group)
    member[order] = torch.arange(len(group), device=group.device) - starts[group[order]]
    return member, int(counts.max()) if len(group) else 0


def cascade_attention(q: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, pseen: torch.Tensor,
                      group: torch.Tensor, member: torch.Tensor, width: int, k: torch.Tensor, v: torch.Tensor,
                      seen: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode step's attention over a prompt cache shared by rows and each row's own cache.

    q [B, H, 1, D]; pk, pv [U, KV, P, D] the prompts' keys and values, pseen [U, P] their real
    tokens; group [B] the prompt each row continues, member [B] its place among that prompt's
    rows (< width); k, v [B, KV, N, D] the rows' own keys and values, seen [B, N] the slots
    written. Returns [B, H, 1, D].

    The rows of a prompt are laid out as one product's rows ([U, KV, width * r, D], r = H / KV:
    grouped-query heads without repeating the cache), so a prompt's keys and values are read once
    for all its rows, not once a row; both softmax halves are one softmax in float32. SDPA's CPU
    kernel is made for many queries and was ~50x slower here on SmolLM2's decode step.
    """
    B, H, _, D = q.shape
    U, KV, P, _ = pk.shape
    r = H // KV
    qr = q.view(B, KV, r, D)
    qg = q.new_zeros(U, width, KV, r, D)
    qg[group, member] = qr                                                      # [U, width, KV, r, D]
    qg = qg.permute(0, 2, 1, 3, 4).reshape(U, KV, width * r, D)
    s1 = torch.matmul(qg, pk.transpose(-1, -2)).view(U, KV, width, r, P)[group, :, member]   # [B, KV, r, P]
    s2 = torch.matmul(qr, k.transpose(-1, -2))                                  # [B, KV, r, N]
    s = torch.cat((s1, s2), -1).float().mul_(scale)
    s.masked_fill_(~torch.cat((pseen[group], seen), -1)[:, None, None], float("-inf"))
    w = torch.softmax(s, -1).to(v.dtype)                                        # [B, KV, r, P + N]
    wg = w.new_zeros(U, width, KV, r, P)
    wg[group, member] = w[..., :P]
    o1 = torch.matmul(wg.permute(0, 2, 1, 3, 4).reshape(U, KV, width * r, P), pv)  # [U, KV, width * r, D]
    o = o1.view(U, KV, width, r, D)[group, :, member] + torch.matmul(w[..., P:], v)  # [B, KV, r, D]
    return o.view(B, H, 1, D)
