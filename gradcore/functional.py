"""gradcore.functional (``F``): MegEngine's functional API on gradcore ops.

Example::

    >>> import gradcore as gc, gradcore.functional as F
    >>> F.relu(gc.tensor([-1.0, 2.0])).numpy()
    array([0., 2.], dtype=float32)
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from . import _core
from ._core import Tensor
from .ops import elemwise as _ew
from .ops.elemwise import Elemwise
from .ops.indexing import IndexingOneHot, SetSubtensor, Subtensor, split_index
from .ops.linalg import MatrixMul
from .ops.nn import LogSoftmax, LogSumExp
from .ops.reduce import Reduce
from .ops.shape import (Broadcast, Cast, Concat, ExpandDims, Identity, Reshape, Squeeze,
                        StopGradient, Transpose)

from .op import interned

_apply = _core.apply

# one op instance per distinct attributes: the per-op caches stay warm
_Reduce, _MatrixMul, _Reshape, _Transpose, _Broadcast = map(interned, (Reduce, MatrixMul, Reshape, Transpose, Broadcast))
_ExpandDims, _Squeeze, _Cast, _Concat, _Subtensor = map(interned, (ExpandDims, Squeeze, Cast, Concat, Subtensor))
_SetSubtensor, _IndexingOneHot, _LogSoftmax, _LogSumExp = map(interned, (SetSubtensor, IndexingOneHot, LogSoftmax, LogSumExp))


def _axis_key(axis):
    return tuple(axis) if isinstance(axis, list) else axis


def _t(x, like: Optional[Tensor] = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "trace"):          # a symbolic tensor inside a trace
        return x
    return Tensor(x, dtype=None if like is None else like.dtype, device=None if like is None else like.device)


# ---- elementwise: one function per table row, generated
def _make(mode):
    op = Elemwise(mode)
    doc = (f"Elementwise ``{_ew.ROWS[mode].numpy}``.\n\n"
           f"Example::\n\n    >>> F.{mode}({', '.join('xyz'[:op.nin])})\n")
    return _core.OpFunction(op, mode, doc)


for _mode in _ew.modes():
    globals()[_mode] = _make(_mode)
del _mode

# MegEngine's names for the same rows
equal, not_equal, less, less_equal, greater, greater_equal = eq, ne, lt, le, gt, ge  # noqa: F821
_where = where  # noqa: F821


def where(mask, x, y):
    """``x`` where ``mask`` is true, else ``y``."""
    return _apply(Elemwise("where"), mask, x, y)[0]


def clip(x, lower=None, upper=None):
    """Limit ``x`` to [lower, upper] (either may be None)."""
    if lower is not None:
        x = maximum(x, lower)  # noqa: F821
    if upper is not None:
        x = minimum(x, upper)  # noqa: F821
    return x


def copy(x):
    return _apply(Identity(), _t(x))[0]


def stop_gradient(x):
    """``x`` with no gradient flowing back through it."""
    return _apply(StopGradient(), _t(x))[0]


def astype(x, dtype):
    x = _t(x)
    if x.dtype == np.dtype(dtype):
        return x
    return _apply(_Cast(np.dtype(dtype)), x)[0]


# ---- reductions
def _reduce(mode):
    def f(inp, axis=None, keepdims: bool = False):
        return _apply(_Reduce(mode, _axis_key(axis), bool(keepdims)), _t(inp))[0]
    f.__name__ = mode
    f.__doc__ = f"{mode} over ``axis`` (None: every axis).\n\nExample::\n\n    >>> F.{mode}(x, axis=1, keepdims=True)\n"
    return f


sum = _reduce("sum")    # noqa: A001
mean = _reduce("mean")
max = _reduce("max")    # noqa: A001
min = _reduce("min")    # noqa: A001
prod = _reduce("prod")


# ---- linear algebra
def matmul(inp1, inp2, transpose_a: bool = False, transpose_b: bool = False):
    """Matrix product with NumPy's rules for 1-D operands and broadcast batch axes.

    Example::

        >>> F.matmul(a, b, transpose_b=True)
    """
    a, b = _t(inp1), _t(inp2)
    sa, sb = a.ndim == 1, b.ndim == 1
    if sa:
        a = expand_dims(a, 0)
        transpose_a = False
    if sb:
        b = expand_dims(b, 1)
        transpose_b = False
    out = _apply(_MatrixMul(bool(transpose_a), bool(transpose_b)), a, b)[0]
    if sa and sb:
        return squeeze(out, (-2, -1))
    if sa:
        return squeeze(out, -2)
    if sb:
        return squeeze(out, -1)
    return out


def dot(inp1, inp2):
    """Inner product of two vectors."""
    a, b = _t(inp1), _t(inp2)
    if a.ndim > 1 or b.ndim > 1:
        raise ValueError(f"dot: expects vectors, got shapes {a.shape} and {b.shape}")
    return sum(a * b)


# ---- shapes
def reshape(inp, target_shape: Sequence[int]):
    if isinstance(target_shape, int):
        target_shape = (target_shape,)
    return _apply(_Reshape(tuple(int(d) for d in target_shape)), _t(inp))[0]


def transpose(inp, pattern: Optional[Sequence[int]] = None):
    x = _t(inp)
    if pattern is None:
        pattern = tuple(range(x.ndim))[::-1]
    return _apply(_Transpose(tuple(int(p) for p in pattern)), x)[0]


def broadcast_to(inp, shape: Sequence[int]):
    x = _t(inp)
    if isinstance(shape, int):
        shape = (shape,)
    return _apply(_Broadcast(tuple(int(d) for d in shape)), x)[0]


def expand_dims(inp, axis):
    return _apply(_ExpandDims(_axis_key(axis)), _t(inp))[0]


def squeeze(inp, axis=None):
    return _apply(_Squeeze(_axis_key(axis)), _t(inp))[0]


def flatten(inp, start_axis: int = 0, end_axis: int = -1):
    x = _t(inp)
    nd = x.ndim
    if nd == 0:
        return reshape(x, (1,))
    s, e = start_axis % nd, end_axis % nd
    shape = x.shape[:s] + (-1,) + x.shape[e + 1:]
    return reshape(x, shape)


def concat(inps, axis: int = 0):
    return _apply(_Concat(int(axis)), *[_t(x) for x in inps])[0]


# ---- indexing
def getitem(x, index):
    spec, arrays = split_index(index)
    arrays = [a if isinstance(a, Tensor) else Tensor(np.asarray(a)) for a in arrays]
    return _apply(_Subtensor(spec), x, *arrays)[0]


def setitem(x, index, value):
    """A copy of ``x`` with ``value`` written at ``index`` (recorded)."""
    spec, arrays = split_index(index)
    arrays = [a if isinstance(a, Tensor) else Tensor(np.asarray(a)) for a in arrays]
    value = value if isinstance(value, Tensor) else _core.wrap_array(np.asarray(value, x.dtype), x.device)
    if value.dtype != x.dtype:
        value = astype(value, x.dtype)
    return _apply(_SetSubtensor(spec), x, value, *arrays)[0]


def indexing_one_hot(src, index, axis: int = 1, keepdims: bool = False):
    """``src[i, index[i]]`` along ``axis``.

    Example::

        >>> F.indexing_one_hot(logits, labels)     # (N, C), (N,) -> (N,)
    """
    return _apply(_IndexingOneHot(int(axis), bool(keepdims)), _t(src), _t(index))[0]


# ---- creation
def zeros(shape, dtype="float32", device=None):
    return Tensor(np.zeros(shape, dtype), device=device)


def ones(shape, dtype="float32", device=None):
    return Tensor(np.ones(shape, dtype), device=device)


def full(shape, value, dtype="float32", device=None):
    return Tensor(np.full(shape, value, dtype), device=device)


def zeros_like(inp):
    return Tensor(np.zeros(inp.shape, inp.dtype), device=inp.device)


def ones_like(inp):
    return Tensor(np.ones(inp.shape, inp.dtype), device=inp.device)


def arange(start=0, stop=None, step=1, dtype="float32", device=None):
    if stop is None:
        start, stop = 0, start
    return Tensor(np.arange(start, stop, step, dtype=dtype), device=device)


def linspace(start, stop, num, dtype="float32", device=None):
    return Tensor(np.linspace(start, stop, num, dtype=dtype), device=device)


def eye(n, m=None, dtype="float32", device=None):
    return Tensor(np.eye(n, m, dtype=dtype), device=device)


# ---- nn
def log_softmax(inp, axis: int = -1):
    return _apply(_LogSoftmax(int(axis)), _t(inp))[0]


def logsumexp(inp, axis: int = -1, keepdims: bool = False):
    return _apply(_LogSumExp(int(axis), bool(keepdims)), _t(inp))[0]


def softmax(inp, axis: int = -1):
    return exp(log_softmax(inp, axis))  # noqa: F821


def cross_entropy(pred, label, axis: int = 1, with_logits: bool = True,
                  label_smooth: float = 0.0, reduction: str = "mean"):
    """Cross-entropy of class scores ``pred`` (logits by default) against
    integer ``label``, MegEngine's ``F.nn.cross_entropy``.

    Example::

        >>> loss = F.cross_entropy(logits, labels)
    """
    pred, label = _t(pred), _t(label)
    if label.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: label must be an integer tensor, got {label.dtype}")
    logp = log_softmax(pred, axis) if with_logits else log(pred)  # noqa: F821
    nll = -indexing_one_hot(logp, label, axis)
    if label_smooth:
        nll = nll * (1 - label_smooth) - mean(logp, axis) * label_smooth
    if reduction == "mean":
        return mean(nll)
    if reduction == "sum":
        return sum(nll)
    if reduction == "none":
        return nll
    raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def linear(inp, weight, bias=None):
    """``inp @ weight.T + bias`` (weight is (out_features, in_features))."""
    out = matmul(inp, weight, transpose_b=True)
    return out if bias is None else out + bias


class _NN:
    """``F.nn.*`` names, as in MegEngine."""


nn = _NN()
for _n in ("relu", "sigmoid", "tanh", "log_softmax", "logsumexp", "softmax", "cross_entropy",
           "linear", "indexing_one_hot"):
    setattr(nn, _n, globals()[_n])
del _n
