"""Neural-network ops: log_softmax (hand VJP: it needs only its output),
logsumexp (declared by decomposition only: its backward graph is derived)."""
from __future__ import annotations

import numpy as np

from gradcore import _core
from gradcore.op import Composite, Op, TensorDesc

from .elemwise import Elemwise
from .reduce import BroadcastBack, Reduce
from .shape import StopGradient


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def _check_axis(op, x):
    if x.shape is not None and not -max(x.ndim, 1) <= op.axis < max(x.ndim, 1):
        raise op.error(f"axis {op.axis} is out of range for {x.ndim} dimensions", x)


class LogSoftmax(Op):
    name = "LogSoftmax"
    attrs = ("axis",)

    def __init__(self, axis=-1):
        self.axis = int(axis)
        self._seal()

    def infer(self, x):
        _check_axis(self, x)
        if x.dtype.kind not in "fc":
            raise self.error(f"needs a floating-point input, got {x.dtype}", x)
        return (x,)

    def cpu(self, x):
        m = np.max(x, axis=self.axis, keepdims=True)
        z = x - m
        return z - np.log(np.sum(np.exp(z), axis=self.axis, keepdims=True))

    def vjp(self, inputs, outputs, grads):
        (x,), (out,), (g,) = inputs, outputs, grads
        s = _apply1(Reduce("sum", self.axis, True), g)
        return [g - _apply1(Elemwise("exp"), out) * s]

    def decompose(self, x):
        return x - _apply1(LogSumExp(self.axis, True), x)


class LogSumExp(Composite):
    """log(sum(exp(x), axis)): forward and backward both come from the
    decomposition below."""
    name = "LogSumExp"
    attrs = ("axis", "keepdims")

    def __init__(self, axis=-1, keepdims=False):
        self.axis, self.keepdims = int(axis), bool(keepdims)
        self._seal()

    def infer(self, x):
        _check_axis(self, x)      # named after this op, not the Reduce inside
        return super().infer(x)

    def decompose(self, x):
        m = _apply1(StopGradient(), _apply1(Reduce("max", self.axis, True), x))
        s = _apply1(Reduce("sum", self.axis, True), _apply1(Elemwise("exp"), x - m))
        out = _apply1(Elemwise("log"), s) + m
        if not self.keepdims:
            from .shape import Squeeze
            out = _apply1(Squeeze(self.axis), out)
        return out
