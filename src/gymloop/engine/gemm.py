"""Float32 matrix products on the CPU, forward and backward: those of the native Llama path
(engine/llama.py: generation; trainer/layer.py: training's layers, `linear` for the inputs'
gradients too and `weight_grad` for the weights') and, through `route_linears`,
of the transformers models the trainers train (trainer/trainer.Trainer, finetune/methods.py).

On a CPU, torch's float32 `F.linear` calls MKL, which picks its kernels by CPU vendor and runs
only AVX2 kernels on AMD processors with AVX-512; oneDNN, also inside torch, runs AVX-512 kernels
there with the same strict float32 arithmetic, about twice as fast on such a CPU
(bench/results/engines/gemm/). So `auto` is oneDNN on a non-Intel CPU where torch runs AVX-512 code, and
torch's own product elsewhere (every GPU, every dtype but float32). A oneDNN call has a fixed cost
of tens of microseconds, so products below ONEDNN_MIN_MACS multiply-adds stay with torch's.

`GYMLOOP_CPU_GEMM=aten|onednn|auto` chooses for a process (read at the first product).
`route_linears(model)` sends a transformers model's own nn.Linear layers through `linear` too
(the GRPO trainer's forward, LoRA jobs).
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import torch
import torch.nn.functional as F

from ..algorithms.table import Table

ENV = "GYMLOOP_CPU_GEMM"
# the smallest product (M x N x K multiply-adds) worth a oneDNN call: on an AMD EPYC, MKL was
# faster for [M, 128] x [128, 512] up to M ~ 24 and [M, 128] x [128, 128] up to M ~ 96
ONEDNN_MIN_MACS = 1 << 21


def _onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ w[out, in].T (+ b [out]) -> [..., out] by oneDNN; x and w may be strided views."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """F.linear's forward and backward, each product by oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _onednn(x, w, b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors                                           # [..., in], [out, in]
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _onednn(g, w.t())                                         # [..., out] @ [out, in] -> [..., in]
        if ctx.needs_input_grad[1]:
            gw = weight_grad(g, x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = bias_grad(g)
        return gx, gw, gb


def onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear through oneDNN (float32 CPU tensors), with autograd when an input needs it."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return _OneDNNLinear.apply(x, w, b)
    return _onednn(x, w, b)


# name -> the product for float32 CPU tensors
GEMMS: Table[Callable[..., torch.Tensor]] = Table("CPU matrix product", {
    "aten": (F.linear, "torch's F.linear (MKL on x86)"),
    "onednn": (onednn_linear, "oneDNN, forward and backward (AVX-512 on AMD CPUs, where MKL runs AVX2)"),
})


def cpu_vendor() -> str:
    """The CPU's vendor id ("GenuineIntel", "AuthenticAMD", ...; "" where /proc/cpuinfo has none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def auto_gemm(vendor: str, capability: str) -> str:
    """The product `auto` picks for a CPU vendor and torch's CPU capability ("AVX512", "AVX2",
    ...): oneDNN where MKL would not use the AVX-512 the CPU has."""
    return "onednn" if capability.startswith("AVX512") and vendor != "GenuineIntel" else "aten"


@functools.cache
def cpu_gemm() -> str:
    """The name of this process's float32 CPU product (GYMLOOP_CPU_GEMM, default auto)."""
    name = os.environ.get(ENV, "auto")
    if name == "auto":
        name = auto_gemm(cpu_vendor(), torch.backends.cpu.get_cpu_capability())
    GEMMS.impl(name)                                                       # a clear error for a bad name
    if name == "onednn" and not torch.backends.mkldnn.is_available():
        raise ValueError(f"{ENV}=onednn, but this torch build has no oneDNN")
    return name


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in], w [out, in], b [out] or None -> [..., out]: F.linear, by this process's
    CPU product for float32 CPU tensors of at least ONEDNN_MIN_MACS multiply-adds (the
    backward's two products have as many as the forward's)."""
    if x.dtype is torch.float32 and x.device.type == "cpu" and w.dtype is torch.float32 \
            and x.numel() * w.shape[0] >= ONEDNN_MIN_MACS:
        return GEMMS.impl(cpu_gemm())(x, w, b)
    return F.linear(x, w, b)


def weight_grad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The weight's gradient of y = linear(x, w): g [..., out] (y's gradient), x [..., in] ->
    [out, in] = g.T @ x over all leading positions, by the same product `linear` picks."""
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])       # [M, out], [M, in]
    if g.dtype is torch.float32 and g.device.type == "cpu" and x.dtype is torch.float32 \
            and g2.numel() * x2.shape[1] >= ONEDNN_MIN_MACS and cpu_gemm() == "onednn":
        return _onednn(g2.t(), x2.t())                                     # [out, M] @ [M, in]
    return g2.t() @ x2


def bias_grad(g: torch.Tensor) -> torch.Tensor:
    """The bias's gradient of y = linear(x, w, b): g [..., out] summed over positions -> [out]."""
    return g.reshape(-1, g.shape[-1]).sum(0)


class RoutedLinear(torch.nn.Linear):
    """nn.Linear whose product is `linear` (route_linears gives a model's layers this class; the
    parameters, state dict and isinstance checks are nn.Linear's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def route_linears(model: torch.nn.Module) -> int:
    """Give every plain nn.Linear of `model` the class RoutedLinear when this process's CPU
    product is not torch's own (nothing changes otherwise); returns how many were routed."""
    if cpu_gemm() == "aten":
        return 0
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for m in layers:
        m.__class__ = RoutedLinear
    return len(layers)
