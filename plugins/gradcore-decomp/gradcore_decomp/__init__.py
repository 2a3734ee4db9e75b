"""gradcore-decomp: ``Mish``, ``x * tanh(softplus(x))``, declared only by
its decomposition into standard ops (a ``gradcore.op.Composite``).

An example of gradient path 3: no VJP and no grad rule; shape inference,
the CPU forward and the backward graph are all derived from ``decompose``,
and second-order gradients come for free.

Registered through the entry point ``gradcore.ops: decomp =
gradcore_decomp:register``; use it with ``mish(x)`` or
``gradcore.ops.get("Mish")``.

Example::

    >>> import gradcore as gc
    >>> from gradcore_decomp import mish
    >>> mish(gc.tensor([0.0, 1.0])).numpy()
    array([0.       , 0.8650984], dtype=float32)
"""
from __future__ import annotations

from gradcore.core import Composite, apply
from gradcore.op import TensorDesc
from gradcore.ops import Elemwise

__all__ = ["Mish", "mish", "register"]

_softplus, _tanh, _mul = Elemwise("softplus"), Elemwise("tanh"), Elemwise("mul")


class Mish(Composite):
    """``x * tanh(softplus(x))`` for floating-point x, elementwise."""

    name = "Mish"

    def infer(self, x):
        if x.dtype.kind != "f":
            raise self.error(f"needs a floating-point input, got {x.dtype}", x)
        return super().infer(x)

    def cpu(self, x):
        # the derived forward would quietly compute in float on an integer x
        if x.dtype.kind != "f":
            raise self.error(f"needs a floating-point input, got {x.dtype}", TensorDesc(x.shape, x.dtype))
        return super().cpu(x)

    def decompose(self, x):
        (sp,) = apply(_softplus, x)
        (t,) = apply(_tanh, sp)
        return apply(_mul, x, t)[0]


_OP = Mish()


def mish(x):
    """Mish activation, ``x * tanh(softplus(x))``."""
    return apply(_OP, x)[0]


def register():
    """Entry point (group ``gradcore.ops``)."""
    from gradcore.registry import register_op
    register_op(Mish)
