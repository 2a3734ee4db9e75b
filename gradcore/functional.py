"""gradcore.functional (``F``): MegEngine's functional API on gradcore ops.

Example::

    >>> import gradcore as gc, gradcore.functional as F
    >>> F.relu(gc.tensor([-1.0, 2.0])).numpy()
    array([0., 2.], dtype=float32)
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import _core
from ._core import Tensor
from .ops import elemwise as _ew
from .ops.elemwise import Elemwise
from .ops.indexing import IndexingOneHot, SetSubtensor, Subtensor, split_index
from .ops.linalg import MatrixMul
from .ops.nn import LogSoftmax, LogSumExp, Softmax
from .ops.reduce import ArgReduce, CumSum, Reduce
from .ops.shape import (Broadcast, Cast, Concat, ExpandDims, Identity, Reshape, Squeeze,
                        StopGradient, Transpose)

from .op import interned

_apply = _core.apply

# one op instance per distinct attributes: the per-op caches stay warm
_Reduce, _MatrixMul, _Reshape, _Transpose, _Broadcast = map(interned, (Reduce, MatrixMul, Reshape, Transpose, Broadcast))
_ExpandDims, _Squeeze, _Cast, _Concat, _Subtensor = map(interned, (ExpandDims, Squeeze, Cast, Concat, Subtensor))
_SetSubtensor, _IndexingOneHot, _LogSoftmax, _LogSumExp = map(interned, (SetSubtensor, IndexingOneHot, LogSoftmax, LogSumExp))
_ArgReduce, _CumSum, _Softmax = map(interned, (ArgReduce, CumSum, Softmax))


def _axis_key(axis):
    return tuple(axis) if isinstance(axis, list) else axis


def _on(x, like) -> Tensor:
    """``x`` as a Tensor on ``like``'s device, with its own dtype (index
    arrays, labels)."""
    if isinstance(x, Tensor) or hasattr(x, "trace"):
        return x
    return Tensor(x, device=getattr(like, "device", None))


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


def argmax(inp, axis=None, keepdims: bool = False):
    """Index of the largest element along ``axis`` (None: flattened), int32."""
    return _apply(_ArgReduce("argmax", axis, bool(keepdims)), _t(inp))[0]


def argmin(inp, axis=None, keepdims: bool = False):
    """Index of the smallest element along ``axis`` (None: flattened), int32."""
    return _apply(_ArgReduce("argmin", axis, bool(keepdims)), _t(inp))[0]


def cumsum(inp, axis: int = 0):
    """Cumulative sum along ``axis``.

    Example::

        >>> F.cumsum(x, axis=1)
    """
    return _apply(_CumSum(int(axis), False), _t(inp))[0]


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
    arrays = [_on(a if isinstance(a, Tensor) else np.asarray(a), x) for a in arrays]
    return _apply(_Subtensor(spec), x, *arrays)[0]


def setitem(x, index, value):
    """A copy of ``x`` with ``value`` written at ``index`` (recorded)."""
    spec, arrays = split_index(index)
    arrays = [_on(a if isinstance(a, Tensor) else np.asarray(a), x) for a in arrays]
    value = value if isinstance(value, Tensor) else Tensor(np.asarray(value, x.dtype), device=x.device)
    if value.dtype != x.dtype:
        value = astype(value, x.dtype)
    return _apply(_SetSubtensor(spec), x, value, *arrays)[0]


def indexing_one_hot(src, index, axis: int = 1, keepdims: bool = False):
    """``src[i, index[i]]`` along ``axis``.

    Example::

        >>> F.indexing_one_hot(logits, labels)     # (N, C), (N,) -> (N,)
    """
    return _apply(_IndexingOneHot(int(axis), bool(keepdims)), _t(src), _on(index, src))[0]


# ---- split, stack, gather, scatter, sort, topk
from .ops.indexing import Gather as _GatherOp, Scatter as _ScatterOp, Sort as _SortOp, TopK as _TopKOp  # noqa: E402
from .ops.shape import Split as _SplitOp, Stack as _StackOp  # noqa: E402

_Split, _Stack, _Gather, _Scatter, _Sort, _TopK = map(
    interned, (_SplitOp, _StackOp, _GatherOp, _ScatterOp, _SortOp, _TopKOp))


def split(inp, nsplits_or_sections, axis: int = 0):
    """Split ``inp`` along ``axis`` into a list of tensors, MegEngine's
    ``F.split``: an int is a number of pieces (sizes as np.array_split: the
    first ``size % n`` pieces one longer), a list gives the split indices.

    Example::

        >>> [p.shape for p in F.split(gc.tensor(np.zeros((5, 2))), [1, 3])]
        [(1, 2), (2, 2), (2, 2)]
    """
    if isinstance(nsplits_or_sections, (int, np.integer)):
        sections = int(nsplits_or_sections)
    else:
        sections = tuple(int(s) for s in nsplits_or_sections)
    return list(_apply(_Split(int(axis), sections), _t(inp)))


def stack(inps, axis: int = 0):
    """Stack equally shaped tensors along a new ``axis``.

    Example::

        >>> F.stack([x, y], axis=1)         # (3,), (3,) -> (3, 2)
    """
    return _apply(_Stack(int(axis)), *[_t(x) for x in inps])[0]


def gather(inp, axis: int, index):
    """``out[i][j] = inp[i][index[i][j]]`` for axis 1 (torch.gather): ``index``
    is an integer tensor of ``inp``'s rank, no larger than ``inp`` outside
    ``axis``; the result has ``index``'s shape.

    Example::

        >>> F.gather(x, 1, gc.tensor([[0, 0], [1, 0]]))
    """
    x = _t(inp)
    return _apply(_Gather(int(axis)), x, _on(index, x))[0]


def scatter(inp, axis: int, index, source):
    """A copy of ``inp`` with ``out[i][index[i][j]] = source[i][j]`` for axis 1
    (torch.scatter, not accumulating). ``source`` is cast to ``inp``'s dtype.

    Example::

        >>> F.scatter(x, 0, gc.tensor([[1, 0, 2]]), src)
    """
    x = _t(inp)
    src = source if isinstance(source, Tensor) or hasattr(source, "trace") else \
        Tensor(np.asarray(source, x.dtype), device=x.device)
    if src.dtype != x.dtype:
        src = astype(src, x.dtype)
    return _apply(_Scatter(int(axis)), x, _on(index, x), src)[0]


def sort(inp, descending: bool = False):
    """``(sorted, indices)`` along the last axis; indices are int32.

    Example::

        >>> values, indices = F.sort(x, descending=True)
    """
    return _apply(_Sort(bool(descending)), _t(inp))


def topk(inp, k: int, descending: bool = False, kth_only: bool = False, no_sort: bool = False):
    """``(values, indices)`` of the ``k`` smallest elements along the last
    axis (the largest with ``descending=True``), MegEngine's ``F.topk``:
    ``kth_only`` returns only the k-th one (the last axis removed),
    ``no_sort`` returns them in index order. Indices are int32.

    Example::

        >>> values, indices = F.topk(x, 3, descending=True)
    """
    mode = "kth_only" if kth_only else "no_sort" if no_sort else "sorted"
    return _apply(_TopK(int(k), bool(descending), mode), _t(inp))


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


def leaky_relu(inp, negative_slope: float = 0.01):
    """``x`` where positive, ``negative_slope * x`` elsewhere."""
    x = _t(inp)
    return where(gt(x, 0), x, x * negative_slope)  # noqa: F821


def softmax(inp, axis: int = -1):
    """exp(x) / sum(exp(x)) along ``axis``."""
    return _apply(_Softmax(int(axis)), _t(inp))[0]


def cross_entropy(pred, label, axis: int = 1, with_logits: bool = True,
                  label_smooth: float = 0.0, reduction: str = "mean"):
    """Cross-entropy of class scores ``pred`` (logits by default) against
    integer ``label``, MegEngine's ``F.nn.cross_entropy``.

    Example::

        >>> loss = F.cross_entropy(logits, labels)
    """
    pred = _t(pred)
    label = _on(label, pred)
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


# ---- convolution and pooling (NCHW)
from .ops.conv import AvgPool2d as _AvgPool2dOp, Conv2d as _Conv2dOp, MaxPool2d as _MaxPool2dOp  # noqa: E402

_Conv2d, _MaxPool2d, _AvgPool2d = map(interned, (_Conv2dOp, _MaxPool2dOp, _AvgPool2dOp))


def _pair(v):
    # anything but an int or a pair goes to the op as is, which says what is wrong
    if isinstance(v, (tuple, list)):
        return (int(v[0]), int(v[1])) if len(v) == 2 else tuple(v)
    return (int(v), int(v))


def conv2d(inp, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
           conv_mode: str = "cross_correlation", compute_mode: str = "default"):
    """2-D convolution (cross-correlation) of ``inp`` (N, C, H, W) with
    ``weight`` (O, C // groups, KH, KW), MegEngine's ``F.conv2d``. A grouped
    weight may also be given in MegEngine's 5-D form (groups, O // groups,
    C // groups, KH, KW). ``bias`` broadcasts against (N, O, OH, OW), e.g.
    shape (1, O, 1, 1).

    Example::

        >>> y = F.conv2d(x, w, b, stride=2, padding=1)
    """
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ValueError(f"conv2d: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    x, w = _t(inp), _t(weight)
    if w.ndim == 5:
        g, og, cg, kh, kw = w.shape
        if g != groups:
            raise ValueError(f"conv2d: a 5-D weight {w.shape} has {g} groups, but groups={groups}")
        w = reshape(w, (g * og, cg, kh, kw))
    out = _apply(_Conv2d(_pair(stride), _pair(padding), _pair(dilation), int(groups)), x, w)[0]
    return out if bias is None else out + _t(bias, out)


def max_pool2d(inp, kernel_size, stride=None, padding=0):
    """Max over ``kernel_size`` windows of ``inp`` (N, C, H, W); ``stride``
    defaults to ``kernel_size``; padding never wins.

    Example::

        >>> F.max_pool2d(x, 2)          # (N, C, H, W) -> (N, C, H // 2, W // 2)
    """
    stride = kernel_size if stride is None else stride
    return _apply(_MaxPool2d(_pair(kernel_size), _pair(stride), _pair(padding)), _t(inp))[0]


def avg_pool2d(inp, kernel_size, stride=None, padding=0, mode: str = "average_count_exclude_padding"):
    """Mean over ``kernel_size`` windows of ``inp`` (N, C, H, W). ``mode``
    "average_count_exclude_padding" (default) divides by the number of
    non-padding elements of each window, "average" by the kernel's size.

    Example::

        >>> F.avg_pool2d(x, 3, stride=1, padding=1)
    """
    stride = kernel_size if stride is None else stride
    return _apply(_AvgPool2d(_pair(kernel_size), _pair(stride), _pair(padding), mode), _t(inp))[0]


# ---- statistics, normalisation, dropout (composites: their gradients come
# from the recorded ops they are made of)
def var(inp, axis=None, keepdims: bool = False):
    """Population variance over ``axis`` (MegEngine's ``F.var``).

    Example::

        >>> F.var(x, axis=1)
    """
    x = _t(inp)
    d = x - mean(x, axis, True)
    return mean(d * d, axis, keepdims)


def std(inp, axis=None, keepdims: bool = False):
    """Population standard deviation over ``axis``."""
    return sqrt(var(inp, axis, keepdims))  # noqa: F821


def norm(inp, ord: float = 2, axis=None, keepdims: bool = False):
    """Vector p-norm over ``axis`` (all elements when None).

    Example::

        >>> F.norm(x, ord=2, axis=-1)
    """
    x = _t(inp)
    if ord == 2:
        return sqrt(sum(x * x, axis, keepdims))  # noqa: F821
    if ord == 1:
        return sum(abs(x), axis, keepdims)  # noqa: F821
    if ord == float("inf"):
        return max(abs(x), axis, keepdims)  # noqa: F821
    if ord == 0:
        return sum(astype(ne(x, 0), x.dtype), axis, keepdims)  # noqa: F821
    return sum(abs(x) ** ord, axis, keepdims) ** (1.0 / ord)  # noqa: F821


def batch_norm(inp, running_mean=None, running_var=None, weight=None, bias=None, *,
               training: bool = False, momentum: float = 0.9, eps: float = 1e-5, inplace: bool = True):
    """Batch normalisation over every axis but 1 (MegEngine's ``F.batch_norm``).

    In training the batch statistics normalise ``inp`` and, when given,
    ``running_mean``/``running_var`` are updated in place as
    ``momentum * running + (1 - momentum) * batch`` (the variance unbiased);
    otherwise the running statistics are used.

    Example::

        >>> y = F.batch_norm(x, rm, rv, w, b, training=True)
    """
    x = _t(inp)
    axes = tuple(i for i in range(x.ndim) if i != 1)
    if training or running_mean is None:
        m = mean(x, axes, True)
        d = x - m
        v = mean(d * d, axes, True)
        if training and running_mean is not None:
            n = x.size // x.shape[1]
            # history-free tensors: computed where x is, never recorded
            with_history = [m.detach(), v.detach() * (n / builtins_max(n - 1, 1))]
            for buf, stat in zip((running_mean, running_var), with_history):
                if buf is not None:
                    new = buf.detach() * momentum + stat.reshape(buf.shape) * (1 - momentum)
                    buf._reset(new.astype(buf.dtype))
    else:
        d = x - running_mean
        v = running_var
    y = d / sqrt(v + eps)  # noqa: F821
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def dropout(inp, drop_prob: float, training: bool = True):
    """Zero each element with probability ``drop_prob`` and scale the rest by
    ``1 / (1 - drop_prob)``; the identity when not training. The mask comes
    from ``gradcore.random`` (``gradcore.random.seed`` makes it repeatable).

    Example::

        >>> F.dropout(x, 0.5)
    """
    x = _t(inp)
    if not training or drop_prob == 0:
        return x
    if not 0 <= drop_prob < 1:
        raise ValueError(f"dropout: drop_prob must be in [0, 1), got {drop_prob}")
    from . import random as _random
    keep = _random.generator().random(x.shape) >= drop_prob
    scale = np.asarray(1.0 / (1.0 - drop_prob), x.dtype)
    return x * Tensor(keep.astype(x.dtype) * scale, device=x.device)


import builtins as _builtins  # noqa: E402
builtins_max = _builtins.max


class _NN:
    """``F.nn.*`` names, as in MegEngine."""


nn = _NN()
for _n in ("relu", "sigmoid", "tanh", "log_softmax", "logsumexp", "softmax", "cross_entropy",
           "linear", "indexing_one_hot", "leaky_relu", "gelu", "silu", "softplus", "logsigmoid", "conv2d", "max_pool2d", "avg_pool2d", "batch_norm",
           "dropout"):
    setattr(nn, _n, globals()[_n])
del _n
