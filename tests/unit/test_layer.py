"""trainer/layer.DecoderLayer, fine-tuning's decoder layer with its backward written out: every
gradient against finite differences (float64) and the layer against HF Llama's formulas run by
autograd (float32), in each of its variants (causal, a packed mask, queries at some positions
only, a shared prefix's keys, grouped-query heads, biases, frozen weights)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gymloop.trainer import layer as L

R, T, H, D, I, EPS = 2, 5, 2, 4, 12, 1e-6


def make(kv_heads: int, bias: bool, dtype, seed: int = 0) -> tuple:
    """Weights (n1, Wq, bq, Wk, bk, Wv, bv, Wo, n2, Wg, Wu, Wd), each a leaf that needs a gradient."""
    g = torch.Generator().manual_seed(seed)
    C, KVD = H * D, kv_heads * D

    def t(*shape, base=0.0):
        return (base + 0.4 * torch.randn(*shape, generator=g, dtype=dtype)).requires_grad_()
    b = (lambda n: t(n)) if bias else (lambda n: None)
    return (t(C, base=1.0), t(C, C), b(C), t(KVD, C), b(KVD), t(KVD, C), b(KVD), t(C, C), t(C, base=1.0),
            t(I, C), t(I, C), t(C, I))


def rotary(pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [R, 1, T, D] at positions pos [R, T] (HF's tables: the halves repeated)."""
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    f = pos[..., None].double() * inv
    f = torch.cat((f, f), -1)[:, None]
    return f.cos().to(dtype), f.sin().to(dtype)


def signed(sin: torch.Tensor) -> torch.Tensor:
    """The sin table rope takes: its first half negated."""
    return torch.cat((-sin[..., :D // 2], sin[..., D // 2:]), -1)


def hf_layer(x, cos, sin, seen, sel, kv, kv_heads, w):
    """The layer as transformers' Llama writes it (rotate_half, repeated kv heads, softmax
    attention over a bool mask seen [R, U, S]), by autograd."""
    n1, wq, bq, wk, bk, wv, bv, wo, n2, wg, wu, wd = w

    def norm(t, weight):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS) * weight

    def heads(y, n):
        return y.view(*y.shape[:2], n, D).transpose(1, 2)

    def rotate(t, c, s):
        return t * c + torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1) * s
    h = norm(x, n1)
    k, v = rotate(heads(F.linear(h, wk, bk), kv_heads), cos, sin), heads(F.linear(h, wv, bv), kv_heads)
    if kv is not None:
        k, v = torch.cat((kv[0].expand(R, -1, -1, -1), k), 2), torch.cat((kv[1].expand(R, -1, -1, -1), v), 2)
    xq, hq, cq, sq = x, h, cos, sin
    if sel is not None:
        rows = torch.arange(R)[:, None]
        xq, hq, cq, sq = x[rows, sel], h[rows, sel], cos[:, 0][rows, sel][:, None], sin[:, 0][rows, sel][:, None]
    q = rotate(heads(F.linear(hq, wq, bq), H), cq, sq)
    k, v = k.repeat_interleave(H // kv_heads, 1), v.repeat_interleave(H // kv_heads, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    o = torch.softmax(scores.masked_fill(~seen[:, None], float("-inf")), -1) @ v
    x1 = xq + F.linear(o.transpose(1, 2).reshape(*xq.shape), wo)
    h2 = norm(x1, n2)
    return x1 + F.linear(F.silu(F.linear(h2, wg)) * F.linear(h2, wu), wd)


def case(kind: str, dtype, seed: int = 0):
    """(x, cos, sin, seen [R, U, S] bool, sel or None, kv or None) for a variant."""
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(R, T, H * D, generator=g, dtype=dtype).requires_grad_()
    P = 3 if kind == "prefix" else 0
    pos = torch.arange(P, P + T).expand(R, T)
    cos, sin = rotary(pos, dtype)
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(R, T, T)
    sel = kv = None
    seen = causal
    if kind == "packed":                       # row 0: two segments after a shared first token
        seen = causal.clone()
        seen[0, 3:, 1:3] = False
    if kind == "sel":                          # the last layer: queries at some positions, a repeated pad
        sel = torch.tensor([[1, 3, 4], [2, 0, 0]])
        seen = torch.arange(T) <= sel[..., None]
    if kind == "prefix":
        kv = tuple((0.5 * torch.randn(1, 1, P, D, generator=g, dtype=dtype)).requires_grad_() for _ in range(2))
        seen = torch.cat((torch.ones(R, T, P, dtype=torch.bool), causal), -1)
    return x, cos, sin, seen, sel, kv


def ours(x, cos, sin, seen, sel, kv, kv_heads, w, causal: bool):
    mask = None if causal else L.additive_mask(seen[:, None], x.dtype)
    if kv is not None:
        kv = tuple(t.expand(1, kv_heads, -1, -1) for t in kv)
    return L.decoder_layer(x, cos, signed(sin), mask, sel, kv, L.Shape(H, kv_heads, D, EPS), w)


KINDS = ["causal", "packed", "sel", "prefix"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kv_heads, bias", [(2, False), (1, True)])
def test_the_written_out_backward_is_the_layers_gradient(kind, kv_heads, bias):
    """torch.autograd.gradcheck in float64: finite differences of the forward against backward,
    for the input, every weight and bias and the prefix's keys and values."""
    w = make(kv_heads, bias, torch.float64)
    x, cos, sin, seen, sel, kv = case(kind, torch.float64)
    leaves = [x, *(t for t in w if t is not None), *(kv or ())]

    def f(*_):
        return ours(x, cos, sin, seen, sel, kv, kv_heads, w, causal=kind == "causal")
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kv_heads, bias", [(2, False), (1, True)])
def test_the_layer_computes_what_hf_llama_does(kind, kv_heads, bias):
    """float32: output and every gradient equal those of the layer written with HF's formulas."""
    w = make(kv_heads, bias, torch.float32, seed=3)
    x, cos, sin, seen, sel, kv = case(kind, torch.float32, seed=3)
    leaves = [x, *(t for t in w if t is not None), *(kv or ())]
    y = ours(x, cos, sin, seen, sel, kv, kv_heads, w, causal=kind == "causal")
    ref = hf_layer(x, cos, sin, seen, sel, None if kv is None else tuple(t.expand(1, kv_heads, -1, -1) for t in kv),
                   kv_heads, w)
    assert y.shape == ref.shape == (R, T if sel is None else sel.shape[1], H * D)
    assert torch.allclose(y, ref, atol=1e-5)
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(ref, leaves, g)):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_frozen_weights_get_no_gradient_and_the_rest_are_unchanged():
    w = make(2, True, torch.float32, seed=5)
    x, cos, sin, seen, sel, kv = case("sel", torch.float32, seed=5)
    live = [t for t in w if t is not None]
    full = dict(zip(map(id, live), torch.autograd.grad(ours(x, cos, sin, seen, sel, kv, 2, w, causal=False).sum(), live)))
    frozen = tuple(t.detach() if i in (1, 9) else t for i, t in enumerate(w))          # Wq and Wg
    trained = [t for t in frozen if t is not None and t.requires_grad]
    part = torch.autograd.grad(ours(x, cos, sin, seen, sel, kv, 2, frozen, causal=False).sum(), trained)
    assert len(trained) == len(live) - 2
    for t, g in zip(trained, part):
        assert torch.allclose(g, full[id(t)])


def test_cpu_flash_and_sdpa_agree_forward_and_backward():
    """The CPU's directly called flash kernels and SDPA's own path (other devices) are one function."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=g)
    k, v = torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)   # grouped-query
    mask = L.additive_mask((torch.rand(2, 1, 3, 6, generator=g) > 0.3) | (torch.arange(6) == 0), torch.float32)
    do = torch.randn(2, 4, 3, 8, generator=g)
    for m in (mask, None):
        kk, vv = (k, v) if m is not None else (k[:, :, :3], v[:, :, :3])          # causal: square
        (o1, b1), (o2, b2) = L.cpu_flash(q, kk, vv, m, 0.3), L.sdpa(q, kk, vv, m, 0.3)
        assert torch.allclose(o1, o2, atol=1e-6)
        for a, b in zip(b1(do), b2(do)):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def test_rope_with_the_signed_table_is_hf_rotary_and_its_gradient_is_the_transpose():
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(2, 3, T, D, generator=g, dtype=torch.float64), torch.randn(2, 3, T, D, generator=g, dtype=torch.float64)
    cos, sin = rotary(torch.arange(T).expand(2, T), torch.float64)
    hf = x * cos + torch.cat((-x[..., D // 2:], x[..., :D // 2]), -1) * sin
    assert torch.equal(L.rope(x, cos, signed(sin)), hf)                     # the same bits, not just close
    xg = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(L.rope(xg, cos, signed(sin)), xg, dy)
    assert torch.allclose(L.rope_grad(dy, cos, signed(sin)), grad)


def test_queries_at_sel_need_a_mask():
    w = make(2, False, torch.float32)
    x, cos, sin, _, _, _ = case("causal", torch.float32)
    with pytest.raises(ValueError, match="explicit mask"):
        L.decoder_layer(x, cos, signed(sin), None, torch.zeros(R, 2, dtype=torch.long), None, L.Shape(H, 2, D, EPS), w)
