"""engine/gemm.py: the native path's matrix products through oneDNN compute what F.linear does,
forward and backward, and the choice of product per CPU and per size."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gymloop.engine import gemm
from gymloop.trainer.logprobs import completion_logprobs, token_logprobs

from conftest import tiny_llama
from test_logprobs import grads, pair_batch

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("shape", [(24, 48), (3, 8, 48)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_onednn_linear_matches_f_linear_and_its_gradients(shape, bias, strided):
    torch.manual_seed(0)
    x = torch.randn(*shape[:-1], shape[-1] * 2)[..., ::2] if strided else torch.randn(*shape)   # a strided view
    w, b = torch.randn(40, 48), torch.randn(40) if bias else None
    g = torch.randn(*shape[:-1], 40)
    leaves = [t.clone().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
    ours = gemm.onednn_linear(*leaves, *([] if bias else [None]))
    theirs_leaves = [t.clone().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
    theirs = F.linear(*theirs_leaves)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    ours.backward(g)
    theirs.backward(g)
    for a, t in zip(leaves, theirs_leaves):
        assert a.grad.shape == t.grad.shape and torch.allclose(a.grad, t.grad, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_onednn_linear_without_grad_or_with_a_frozen_input():
    x, w = torch.randn(5, 16), torch.randn(8, 16)
    with torch.no_grad():
        assert torch.allclose(gemm.onednn_linear(x, w.requires_grad_()), F.linear(x, w), atol=1e-5)
    xg = x.clone().requires_grad_()
    gemm.onednn_linear(xg, w.detach()).sum().backward()        # the frozen weight gets no gradient
    assert torch.allclose(xg.grad, w.detach().sum(0).expand(5, 16), atol=1e-5)


@pytest.mark.parametrize("vendor, capability, want", [
    ("AuthenticAMD", "AVX512", "onednn"),       # Zen 4 / 5: MKL would run AVX2 kernels
    ("GenuineIntel", "AVX512", "aten"),         # MKL's own AVX-512 path
    ("AuthenticAMD", "AVX2", "aten"),           # no AVX-512 to gain
    ("GenuineIntel", "AVX2", "aten"),
    ("", "DEFAULT", "aten"),                    # ARM, or no /proc/cpuinfo
])
def test_auto_picks_onednn_only_where_mkl_leaves_avx512_unused(vendor, capability, want):
    assert gemm.auto_gemm(vendor, capability) == want


def test_the_environment_variable_chooses_and_a_bad_name_is_a_clear_error(monkeypatch):
    gemm.cpu_gemm.cache_clear()
    try:
        monkeypatch.setenv(gemm.ENV, "aten")
        assert gemm.cpu_gemm() == "aten"
        gemm.cpu_gemm.cache_clear()
        monkeypatch.setenv(gemm.ENV, "blas")
        with pytest.raises(ValueError, match="unknown CPU matrix product 'blas'; known: aten, onednn"):
            gemm.cpu_gemm()
    finally:
        monkeypatch.delenv(gemm.ENV)
        gemm.cpu_gemm.cache_clear()


@needs_onednn
def test_only_products_worth_a_onednn_call_take_it(monkeypatch):
    calls = []
    real = gemm._onednn
    monkeypatch.setattr(gemm, "cpu_gemm", lambda: "onednn")
    monkeypatch.setattr(gemm, "_onednn", lambda *a: calls.append(a[0].shape) or real(*a))
    small, big = torch.randn(4, 128), torch.randn(256, 128)
    w = torch.randn(128, 128)
    assert torch.allclose(gemm.linear(small, w), F.linear(small, w))
    assert calls == []                                          # 4 x 128 x 128 < ONEDNN_MIN_MACS
    assert torch.allclose(gemm.linear(big, w), F.linear(big, w), atol=1e-4)
    assert calls == [big.shape]
    assert gemm.linear(big.double(), w.double()).dtype == torch.float64   # other dtypes: torch's product
    assert len(calls) == 1


@needs_onednn
@pytest.mark.parametrize("name", ["aten", "onednn"])
def test_the_native_training_forward_is_the_plain_one_with_either_product(tok, monkeypatch, name):
    """Every product of the packed training forward through `name` (the size threshold off, so the
    tiny model's products take it too): log-probs and gradients are the HF forward's."""
    monkeypatch.setattr(gemm, "cpu_gemm", lambda: name)
    monkeypatch.setattr(gemm, "ONEDNN_MIN_MACS", 0)
    model = tiny_llama(tok.vocab_size, seed=1, kv_heads=2)
    b = pair_batch(tok, [("1+2=", ("3", "4")), ("13+40=", ("53", "530"))],
                   extra=[[{"role": "user", "content": "99+1="}, {"role": "assistant", "content": "100"}]], system=True)
    plain = token_logprobs(model, b) * b.loss_mask
    fast = completion_logprobs(model, b)
    assert torch.allclose(plain, fast, atol=1e-5)
    for g1, g2 in zip(grads(model, plain.sum()), grads(model, fast.sum())):
        assert torch.allclose(g1, g2, atol=1e-5)


@needs_onednn
def test_routed_linears_compute_what_the_model_did_and_pickle(tok, monkeypatch):
    """route_linears gives a transformers model's nn.Linear layers gemm.linear as their product:
    the same log-probs and gradients, the same state dict, a model that still pickles (Ray ships
    models to actors); and nothing changes where torch's product is this process's."""
    import pickle

    from gymloop.trainer.logprobs import make_batch

    model = tiny_llama(tok.vocab_size, seed=2)
    monkeypatch.setattr(gemm, "cpu_gemm", lambda: "aten")
    assert gemm.route_linears(model) == 0 and not any(isinstance(m, gemm.RoutedLinear) for m in model.modules())
    ids, mask = tok.sft_ids([{"role": "user", "content": "12+30="}, {"role": "assistant", "content": "42"}])
    b = make_batch([ids, ids[:-1]], [mask, mask[:-1]], None, tok.pad_token_id)
    before = token_logprobs(model, b)
    g_before = grads(model, (before * b.loss_mask).sum())
    monkeypatch.setattr(gemm, "cpu_gemm", lambda: "onednn")
    monkeypatch.setattr(gemm, "ONEDNN_MIN_MACS", 0)
    calls = []
    real = gemm._onednn
    monkeypatch.setattr(gemm, "_onednn", lambda *a: calls.append(1) or real(*a))
    n = gemm.route_linears(model)
    assert n == sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear)) > 0
    after = token_logprobs(model, b)
    assert calls and torch.allclose(before, after, atol=1e-5)
    for g1, g2 in zip(g_before, grads(model, (after * b.loss_mask).sum())):
        assert torch.allclose(g1, g2, atol=1e-5)
    assert type(pickle.loads(pickle.dumps(model)).model.layers[0].mlp.up_proj) is gemm.RoutedLinear
