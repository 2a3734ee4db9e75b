"""Reductions over axes: sum, mean, max, min, prod."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from gradcore import _core
from gradcore.op import Op, TensorDesc, broadcast_view

from .elemwise import Elemwise
from .shape import Cast


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def norm_axis(axis) -> Optional[Tuple[int, ...]]:
    if axis is None:
        return None
    if isinstance(axis, (tuple, list)):
        return tuple(int(a) for a in axis)
    return (int(axis),)


def reduced_shape(op, shape, axis, keepdims, desc):
    if shape is None:
        return None
    nd = len(shape)
    axes = tuple(range(nd)) if axis is None else axis
    norm = set()
    for a in axes:
        if not -nd <= a < nd and not (nd == 0 and a in (0, -1)):
            raise op.error(f"axis {a} is out of range for {nd} dimensions", desc)
        norm.add(a % nd if nd else 0)
    if keepdims:
        return tuple(1 if i in norm else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in norm)


def _mean(x, axis, dtype, out, keepdims):
    return np.mean(x, axis=axis, keepdims=keepdims)


# ufunc reductions called positionally: (array, axis, dtype, out, keepdims)
_KERNELS = {"sum": np.add.reduce, "mean": _mean, "max": np.maximum.reduce,
            "min": np.minimum.reduce, "prod": np.multiply.reduce}


class Reduce(Op):
    """Reduce over ``axis`` (None: all) with mode sum, mean, max, min or prod."""
    name = "Reduce"
    attrs = ("mode", "axis", "keepdims")

    def __init__(self, mode: str, axis=None, keepdims: bool = False):
        if mode not in _KERNELS:
            raise ValueError(f"Reduce: unknown mode {mode!r}; known: {', '.join(_KERNELS)}")
        self.mode, self.axis, self.keepdims = mode, norm_axis(axis), bool(keepdims)
        self._kernel = _KERNELS[mode]
        self._seal()

    def infer(self, x):
        shape = reduced_shape(self, x.shape, self.axis, self.keepdims, x)
        if self.mode in ("max", "min") and x.shape is not None and 0 in x.shape:
            if self.axis is None or any(x.shape[a] == 0 for a in self.axis):
                raise self.error("cannot take max/min over an empty dimension", x)
        if self.mode == "mean":
            dtype = x.dtype if x.dtype.kind in "fc" else np.dtype("float64")
        elif self.mode in ("sum", "prod") and x.dtype.kind in "biu":
            dtype = np.sum(np.zeros(1, x.dtype)).dtype
        else:
            dtype = x.dtype
        return (TensorDesc(shape, dtype, x.device),)

    def cpu(self, x):
        # axis 0 / -1 of a 0-d array is the array itself (NumPy rejects a tuple axis there)
        axis = None if x.ndim == 0 else self.axis
        return self._kernel(x, axis, None, None, self.keepdims)

    def vjp(self, inputs, outputs, grads):
        (x,), (out,), (g,) = inputs, outputs, grads
        if self.mode in ("sum", "mean"):
            return [_apply1(BroadcastBack(self.axis, self.keepdims, self.mode == "mean"), g, x)]
        if self.mode == "prod":
            # d out / d x_i is the product of the other elements; out / x_i would be
            # 0 / 0 at a zero. Zeros count as ones in ``others``; ``rest`` is the
            # product of the other elements that are zero: 1 when there is none, the
            # one zero itself when there is one (value 0, but slope 1 for the second
            # order), 0 when there are more.
            back = BroadcastBack(self.axis, self.keepdims, False)
            red = lambda mode, t: _apply1(back, _apply1(Reduce(mode, self.axis, self.keepdims), t), x)
            is_ = lambda t, v: _apply1(Cast(x.dtype), _apply1(Elemwise("eq"), t, v))
            zero = is_(x, 0)
            nz = x + zero
            others = red("prod", nz) / nz
            elsewhere = red("sum", zero) - zero
            rest = is_(elsewhere, 0) + is_(elsewhere, 1) * (red("sum", x * zero) - x * zero)
            return [_apply1(back, g, x) * others * rest]
        # max / min: the gradient is shared evenly between tied elements
        back = BroadcastBack(self.axis, self.keepdims, False)
        hit = _apply1(Cast(x.dtype), _apply1(Elemwise("eq"), x, _apply1(back, out, x)))
        count = _apply1(back, _apply1(Reduce("sum", self.axis, self.keepdims), hit), x)
        return [_apply1(back, g, x) * hit / count]


class BroadcastBack(Op):
    """Broadcast a reduced gradient back to the shape of ``ref`` (and divide
    by the element count for a mean): the backward of a reduction."""
    name = "BroadcastBack"
    attrs = ("axis", "keepdims", "mean")
    shape_only_inputs = (1,)

    def __init__(self, axis, keepdims, mean=False):
        self.axis, self.keepdims, self.mean = norm_axis(axis), bool(keepdims), bool(mean)
        self._seal()

    def infer(self, g, ref):
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref):
        shape = ref.shape
        if self.axis is None and not self.mean:
            return broadcast_view(g, shape)     # a full reduction: a 0-d or all-ones g
        if not self.keepdims and len(shape):
            axes = range(len(shape)) if self.axis is None else {a % len(shape) for a in self.axis}
            kept = tuple(1 if i in axes else s for i, s in enumerate(shape))
            g = np.asarray(g).reshape(kept)
        out = broadcast_view(g, shape)
        if self.mean:
            count = out.size // max(np.size(g), 1) if out.size else 1
            out = out / np.asarray(count, dtype=out.dtype)
        return out

    def vjp(self, inputs, outputs, grads):
        mode = "mean" if self.mean else "sum"
        return [_apply1(Reduce(mode, self.axis, self.keepdims), grads[0]), None]
