"""gradcore-fused-act: ``FusedBiasGelu``, ``gelu(x + bias)`` in one kernel.

An example of gradient path 1 (the op's own ``_grad_rule``): the forward
runs the op's own fused kernel (one pass, no ``x + bias`` temporary kept),
and the backward is written with gradcore ops, so it is itself recorded and
second-order gradients work. GELU is the tanh approximation used by the
fused bias-GELU of Megatron/GPT-2::

    y = 0.5 * h * (1 + tanh(k * (h + 0.044715 * h**3))),  h = x + bias,  k = sqrt(2 / pi)

Registered through the entry point ``gradcore.ops: fused_act =
gradcore_fused_act:register``; use it with ``fused_bias_gelu(x, bias)`` or
``gradcore.ops.get("FusedBiasGelu")``.

Example::

    >>> import gradcore as gc
    >>> from gradcore_fused_act import fused_bias_gelu
    >>> fused_bias_gelu(gc.tensor([[0.0, 1.0]]), gc.tensor([0.0, 0.0])).numpy()
    array([[0.       , 0.8411919]], dtype=float32)
"""
from __future__ import annotations

import math

import numpy as np

import gradcore.functional as F
from gradcore.core import apply
from gradcore.cuda.kernels import Kernel
from gradcore.op import Op, TensorDesc

__all__ = ["FusedBiasGelu", "fused_bias_gelu", "register"]

_K = math.sqrt(2.0 / math.pi)
_C = 0.044715


class FusedBiasGelu(Op):
    """``gelu(x + bias)``: x of shape (..., C), bias of shape (C,), both of
    the same floating-point dtype; the output has x's shape."""

    name = "FusedBiasGelu"

    def infer(self, x, bias):
        if x.dtype.kind != "f" or bias.dtype != x.dtype:
            raise self.error(f"needs two floating-point inputs of one dtype, got {x.dtype} and {bias.dtype}",
                             x, bias)
        if x.shape is not None and bias.shape is not None:
            if x.ndim < 1 or bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
                raise self.error("bias must be 1-D with the size of x's last axis", x, bias)
        return (TensorDesc(x.shape, x.dtype, x.device),)

    # ---- kernels
    def cpu(self, x, bias):
        if x.ndim < 1 or bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
            raise ValueError(f"bias of shape {bias.shape} does not match x of shape {x.shape}")
        h = x + bias
        u = h * h
        u *= _C
        u += 1
        u *= h
        u *= _K
        np.tanh(u, out=u)
        u += 1
        u *= h
        u *= 0.5
        return u.astype(x.dtype, copy=False)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_fused_bias_gelu_<ctype>(x, bias, y, n, c)``: x and y
        contiguous with n elements, bias of c elements broadcast along x's
        last axis; a grid-stride loop, one element per thread."""
        return Kernel("fused_bias_gelu", "const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, "
                      "long long n, long long c", f"""
            const T h = x[i] + bias[i % c];
            const T u = (T){_K!r} * (h + (T){_C!r} * h * h * h);
            y[i] = (T)0.5 * h * ((T)1 + tanh(u));""", over="n", index="i").source(ctype)

    def cuda(self, be, x, bias):
        """The launcher (device arrays in and out): one grid-stride launch."""
        y = be.empty(x.shape, x.dtype)
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, bias, y, y.size, max(bias.size, 1))
        return y

    # ---- gradient path 1
    def _grad_rule(self, x, bias):
        # recording is off in here: this runs the kernel above
        (y,) = apply(self, x, bias)

        def backward(dy):
            if dy is None:
                return None, None
            # gradcore ops, recorded when an outer manager records: the
            # backward is itself differentiable
            h = x + bias
            h2 = h * h
            t = F.tanh((h2 * _C + 1) * h * _K)
            dh = dy * (((t + 1) + h * (1 - t * t) * ((h2 * (3 * _C) + 1) * _K)) * 0.5)
            # bias's gradient in the broadcast shape: the core sums it down
            return dh, dh

        return (y,), backward


_OP = FusedBiasGelu()


def fused_bias_gelu(x, bias):
    """``gelu(x + bias)`` (tanh approximation) in one fused kernel.

    Example::

        >>> y = fused_bias_gelu(x, b)        # x: (N, C), b: (C,)
    """
    return apply(_OP, x, bias)[0]


def register():
    """Entry point (group ``gradcore.ops``)."""
    from gradcore.registry import register_op
    register_op(FusedBiasGelu)
