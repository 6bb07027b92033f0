"""One Llama decoder layer for training, forward and backward written out (DecoderLayer): the
trainer's backward pass on the native path.

Training's packed forward on the native path (engine/llama.LlamaBackend.packed_logits) runs every layer through
this function instead of autograd's graph of the same ~40 operations: on a CPU a small model's
step is largely overhead around small kernels (graph nodes, saved tensors, gradient sums, a
decomposed RMSNorm backward). Written out, the backward runs the products of engine/gemm.py
(linear for the inputs' gradients, weight_grad for the weights'), torch's attention kernels
(ATTENTION) and the RMSNorm gradient in a few kernels, a few per cent off a nano SFT step.
tests/unit/test_layer.py checks every gradient against finite
differences (float64) and against autograd on the same layer.

A layer, with C = H * D channels, I MLP channels, KV key/value heads:

    h  = rmsnorm(x) * n1                      x [R, T, C]
    q  = rope(h @ Wq.T + bq)                  [R, H, U, D]   (U = T, or the positions `sel`)
    k  = rope(h @ Wk.T + bk); v = h @ Wv.T + bv                [R, KV, T, D]
    o  = attention(q, k, v)                   [R, H, U, D]   causal, or an additive mask
    x1 = x + o @ Wo.T                         [R, U, C]
    h2 = rmsnorm(x1) * n2
    g  = h2 @ Wg.T; u = h2 @ Wu.T             [R, U, I]
    y  = x1 + (silu(g) * u) @ Wd.T            [R, U, C]
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from ..engine.gemm import bias_grad, linear, weight_grad
from ..engine.ops import Shape, additive_mask, merge_heads, rope, split_heads

__all__ = ["DecoderLayer", "Shape", "additive_mask", "decoder_layer", "merge_heads", "rope", "split_heads"]

aten = torch.ops.aten


def rope_grad(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The gradient through `rope` (its transpose; rolling by D/2 is its own inverse):
    g [B, h, T, D] -> [B, h, T, D]."""
    return torch.addcmul((g * sin).roll(g.shape[-1] // 2, -1), g, cos)


def rms_norm_grad(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
                  need_weight: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gradients of y = x * rstd * weight (rstd = 1 / rms(x), over the last dimension):
    dy, x [..., C], rstd [..., 1], weight [C] -> (dx [..., C], dweight [C] or None)."""
    xhat = x * rstd
    dxhat = dy * weight
    dx = (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True)) * rstd
    dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(0) if need_weight else None
    return dx, dw


def _bias_grad(g: torch.Tensor, b: torch.Tensor | None, needed: bool) -> torch.Tensor | None:
    return bias_grad(g) if b is not None and needed else None


Backward = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def cpu_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> tuple[torch.Tensor, Backward]:
    """torch's flash-attention kernels for a CPU (what SDPA runs there), called directly: the
    forward returns the log-sum-exp its backward reads, so no graph is built (~2% of a nano SFT
    step against `sdpa`)."""
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, mask is None, attn_mask=mask, scale=scale)
    return o, lambda do: aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do.contiguous(), q, k, v, o, lse, 0.0, mask is None, attn_mask=mask, scale=scale)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         scale: float) -> tuple[torch.Tensor, Backward]:
    """SDPA with the kernel it picks for the device, and its own backward (a graph of one node)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                           enable_gqa=k.shape[1] != q.shape[1])
    return o.detach(), lambda do: torch.autograd.grad(o, (q, k, v), do)


# attention by device type (others: sdpa): q [R, H, U, D], k, v [R, KV, S, D], mask None (causal,
# U = S) or [R, 1, U, S] additive -> (o [R, H, U, D], its backward: do -> (dq, dk, dv))
ATTENTION: dict[str, Callable[..., tuple[torch.Tensor, Backward]]] = {"cpu": cpu_flash}


class DecoderLayer(torch.autograd.Function):
    """y = layer(x): x [R, T, C] -> y [R, U, C], U = T or sel's width.

    cos, sin [R, 1, T, D]: the rotary table at each token's position. mask: None (causal) or an
    additive float mask [R, 1, U, P + T] (0 where a query sees a key, -inf elsewhere). sel: None,
    or [R, U] positions: only their queries, attention and MLP are computed (the last layer,
    which only the trained positions' logits read), the keys and values of every position.
    kh, vh: None, or keys and values [1, KV, P, D] every row sees before its own (a prefix
    common to the batch, run once; their gradients are summed over the rows). w: the layer's
    weights (n1, Wq, bq, Wk, bk, Wv, bv, Wo, n2, Wg, Wu, Wd), biases None when absent.
    """

    @staticmethod
    def forward(ctx, x, cos, sin, mask, sel, kh, vh, shape: Shape, *w):
        n1, wq, bq, wk, bk, wv, bv, wo, n2, wg, wu, wd = w
        R, T, C = x.shape
        if sel is not None and mask is None:
            raise ValueError("queries at `sel` need an explicit mask")
        h, r1 = aten._fused_rms_norm(x, [C], n1, shape.eps)                 # [R, T, C], rstd [R, T, 1]
        k = rope(split_heads(linear(h, wk, bk), shape.kv_heads), cos, sin)     # [R, KV, T, D]
        v = split_heads(linear(h, wv, bv), shape.kv_heads)
        if kh is not None:
            k = torch.cat((kh.expand(R, -1, -1, -1), k), 2)                # [R, KV, P + T, D]
            v = torch.cat((vh.expand(R, -1, -1, -1), v), 2)
        if sel is None:
            xq, hq, cq, sq = x, h, cos, sin
        else:
            rows = torch.arange(R, device=x.device)[:, None]
            xq, hq = x[rows, sel], h[rows, sel]                             # [R, U, C]
            cq, sq = cos[:, 0][rows, sel][:, None], sin[:, 0][rows, sel][:, None]
        q = rope(split_heads(linear(hq, wq, bq), shape.heads), cq, sq)         # [R, H, U, D]
        o, attn = ATTENTION.get(q.device.type, sdpa)(q, k, v, mask, 1.0 / math.sqrt(shape.head_dim))
        o2 = merge_heads(o)                                                     # [R, U, C]
        x1 = xq + linear(o2, wo)
        h2, r2 = aten._fused_rms_norm(x1, [C], n2, shape.eps)
        g, u = linear(h2, wg), linear(h2, wu)                              # [R, U, I]
        sg = F.silu(g)
        m = sg * u
        ctx.save_for_backward(x, h, r1, hq, o2, x1, h2, r2, g, u, sg, m, cos, sin, cq, sq, sel, *w)
        # the attention's backward keeps q, k, v, o (and the log-sum-exp) itself
        ctx.attn, ctx.shape, ctx.prefix = attn, shape, 0 if kh is None else kh.shape[2]
        return x1 + linear(m, wd)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, h, r1, hq, o2, x1, h2, r2, g, u, sg, m, cos, sin, cq, sq, sel, *w = ctx.saved_tensors
        n1, wq, bq, wk, bk, wv, bv, wo, n2, wg, wu, wd = w
        need = ctx.needs_input_grad[8:]                                    # one per weight
        shape, P = ctx.shape, ctx.prefix
        dy = dy.contiguous()
        # MLP: y = x1 + (silu(g) * u) @ Wd.T
        dm = linear(dy, wd.t())                                            # [R, U, I]
        dwd = weight_grad(dy, m) if need[11] else None
        dg = aten.silu_backward(dm * u, g)
        du = dm * sg
        dwg = weight_grad(dg, h2) if need[9] else None
        dwu = weight_grad(du, h2) if need[10] else None
        dh2 = linear(dg, wg.t()) + linear(du, wu.t())                     # [R, U, C]
        dx1, dn2 = rms_norm_grad(dh2, x1, r2, n2, need[8])
        dx1 = dx1 + dy
        # attention: x1 = xq + o @ Wo.T
        dwo = weight_grad(dx1, o2) if need[7] else None
        dq, dk, dv = ctx.attn(split_heads(linear(dx1, wo.t()), shape.heads))
        dkh = dvh = None
        if P:
            dkh, dvh = dk[:, :, :P].sum(0, keepdim=True), dv[:, :, :P].sum(0, keepdim=True)   # [1, KV, P, D]
            dk, dv = dk[:, :, P:], dv[:, :, P:]
        dq, dk, dv = merge_heads(rope_grad(dq, cq, sq)), merge_heads(rope_grad(dk, cos, sin)), merge_heads(dv)
        dwq = weight_grad(dq, hq) if need[1] else None
        dwk = weight_grad(dk, h) if need[3] else None
        dwv = weight_grad(dv, h) if need[5] else None
        dh = linear(dk, wk.t()) + linear(dv, wv.t())                      # [R, T, C]
        dhq = linear(dq, wq.t())                                           # [R, U, C]
        if sel is None:
            dh = dh + dhq
        else:
            rows = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(sel)
            dh.index_put_((rows, sel), dhq, accumulate=True)
        dx, dn1 = rms_norm_grad(dh, x, r1, n1, need[0])
        if sel is None:
            dx = dx + dx1
        else:
            dx.index_put_((rows, sel), dx1, accumulate=True)
        return (dx, None, None, None, None, dkh, dvh, None, dn1, dwq, _bias_grad(dq, bq, need[2]),
                dwk, _bias_grad(dk, bk, need[4]), dwv, _bias_grad(dv, bv, need[6]), dwo,
                dn2, dwg, dwu, dwd)


def decoder_layer(x, cos, sin, mask, sel, kv, shape: Shape, w: tuple) -> torch.Tensor:
    """DecoderLayer.apply, the prefix's keys and values kv = (kh, vh) or None, the weights a
    tuple (see DecoderLayer)."""
    kh, vh = kv if kv is not None else (None, None)
    return DecoderLayer.apply(x, cos, sin, mask, sel, kh, vh, shape, *w)
