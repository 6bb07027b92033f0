"""Native decode path for Llama-family models (Llama, SmolLM2, Qwen2-style q/k/v bias).

A Hugging Face `generate` step spends most of its time in Python around small kernels; this
backend runs the same math on the model's own parameter tensors (read by reference, so a
weight update is visible without copying) with a preallocated KV cache and a precomputed
rotary table. `supports()` says why a model cannot use it; such models use the HF backend.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SUPPORTED_TYPES = ("llama", "qwen2")


def _rope_theta(cfg) -> tuple[float, str]:
    params = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return float(theta), kind


def supports(model: torch.nn.Module) -> str | None:
    """None if the native path computes exactly what the model's forward does, else why not."""
    if hasattr(model, "peft_config"):
        return "LoRA adapters (peft) run in the model's own forward"
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

    def __init__(self, model: torch.nn.Module) -> None:
        why = supports(model)
        if why:
            raise ValueError(f"native Llama backend cannot run this model: {why}")
        cfg = model.config
        self.model = model
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

    def refresh(self) -> None:
        """Re-read parameter references (after the model's tensors were replaced)."""
        m = self.model
        self.embed = m.get_input_embeddings().weight                 # [V, H]
        self.lm_head = m.get_output_embeddings().weight              # [V, H]
        dec = m.get_decoder()
        self.final_norm = dec.norm.weight
        self.layers = []
        for layer in dec.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight,
                a.k_proj.bias, a.v_proj.weight, a.v_proj.bias, a.o_proj.weight,
                layer.post_attention_layernorm.weight, mlp.gate_proj.weight, mlp.up_proj.weight,
                mlp.down_proj.weight,
            ))

    # --- rotary table ---------------------------------------------------------------
    def _rope_table(self, n: int) -> None:
        if self._cos.shape[0] >= n and self._cos.device == self.device:
            return
        n = max(n, 2 * self._cos.shape[0], 64)
        f = torch.arange(n, dtype=torch.float32)[:, None] * self.inv_freq  # [n, D/2]
        f = torch.cat([f, f], -1).to(self.device)                           # [n, D]
        self._cos, self._sin = f.cos(), f.sin()

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [B, h, T, D]; cos/sin [B, 1, T, D]
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat((-x2, x1), -1) * sin

    # --- forward ----------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, attn: torch.Tensor, t0: int) -> torch.Tensor:
        """ids/pos [B, T]; attn [B, 1, T, t0+T] bool; writes cache slots t0..t0+T-1.

        Returns logits of the last position, [B, V].
        """
        T = ids.shape[1]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[i, :, :, t0:t0 + T] = k
            self.v[i, :, :, t0:t0 + T] = v
            kc, vc = self.k[i, :, :, :t0 + T], self.v[i, :, :, :t0 + T]  # [B, KV, S, D]
            return F.scaled_dot_product_attention(q, kc, vc, attn_mask=attn, scale=1.0 / math.sqrt(self.head_dim),
                                                  enable_gqa=self.n_kv != self.n_heads)
        x = self._layers(ids, pos, attend)
        x = F.rms_norm(x[:, -1], (x.shape[-1],), self.final_norm, self.eps)
        return F.linear(x, self.lm_head)                          # [B, V]

    def _layers(self, ids: torch.Tensor, pos: torch.Tensor, attend) -> torch.Tensor:
        """The decoder stack on ids/pos [B, T] -> hidden states [B, T, H*D] before the final norm;
        `attend(layer, q, k, v)` -> [B, H, T, D] is the attention (cached decode or causal)."""
        B, T = ids.shape
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        dtype = self.embed.dtype
        x = F.embedding(ids, self.embed)                          # [B, T, H*D]
        cos = self._cos[pos].to(dtype)[:, None]                   # [B, 1, T, D]
        sin = self._sin[pos].to(dtype)[:, None]
        for i, (n1, wq, bq, wk, bk, wv, bv, wo, n2, wg, wu, wd) in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), n1, self.eps)
            q = F.linear(h, wq, bq).view(B, T, H, D).transpose(1, 2)     # [B, H, T, D]
            k = F.linear(h, wk, bk).view(B, T, KV, D).transpose(1, 2)    # [B, KV, T, D]
            v = F.linear(h, wv, bv).view(B, T, KV, D).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            o = attend(i, q, k, v)                                        # [B, H, T, D]
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, H * D), wo)
            h = F.rms_norm(x, (x.shape[-1],), n2, self.eps)
            x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
        return x

    def train_logits(self, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Training's forward, with autograd, on right-padded ids [B, T]: the logits of positions
        `keep` [K] only, [B, K, V] (the vocabulary projection is the costly part of small models).
        Causal attention over each row's real tokens (a right-padded row's padding comes after
        them, so no real token sees it)."""
        T = ids.shape[1]
        self._rope_table(T)
        pos = torch.arange(T, device=ids.device).expand(ids.shape[0], T)

        def attend(i, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_dim),
                                                  enable_gqa=self.n_kv != self.n_heads)
        x = self._layers(ids, pos, attend)[:, keep]               # [B, K, H*D]
        return F.linear(F.rms_norm(x, (x.shape[-1],), self.final_norm, self.eps), self.lm_head)

    @torch.inference_mode()
    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        B, P = ids.shape
        total = P + max_new_tokens
        self._rope_table(total)
        L = len(self.layers)
        dtype = self.embed.dtype
        dev = ids.device
        self.k = torch.zeros(L, B, self.n_kv, total, self.head_dim, dtype=dtype, device=dev)
        self.v = torch.zeros_like(self.k)
        self.key_mask = torch.zeros(B, total, dtype=torch.bool, device=dev)
        self.key_mask[:, :P] = mask
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)           # [B, P] real-token positions
        self.next_pos = mask.long().sum(-1)                       # [B]
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        # A padding query sees only itself, so no softmax row is empty (which would be NaN).
        attn = (causal & mask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=dev)
        self.t = P
        return self._forward(ids, pos, attn[:, None], 0)

    @torch.inference_mode()
    def step(self, tok: torch.Tensor) -> torch.Tensor:
        t = self.t
        self.key_mask[:, t] = True
        logits = self._forward(tok[:, None], self.next_pos[:, None],
                               self.key_mask[:, None, None, : t + 1], t)
        self.next_pos += 1
        self.t = t + 1
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        self.k = self.k[:, rows]
        self.v = self.v[:, rows]
        self.key_mask = self.key_mask[rows]
        self.next_pos = self.next_pos[rows]
