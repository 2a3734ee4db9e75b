"""gradcore.functional (``F``): MegEngine's functional API on gradcore ops.

Example::

    >>> import gradcore as gc, gradcore.functional as F
    >>> F.relu(gc.tensor([-1.0, 2.0])).numpy()
    array([0., 2.], dtype=float32)
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import operator

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

from .op import OpError, interned

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
    return _new_tensor(x, None, getattr(like, "device", None), None)


def _t(x, like: Optional[Tensor] = None, name: Optional[str] = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "trace"):          # a symbolic tensor inside a trace
        return x
    return _new_tensor(x, None if like is None else like.dtype, None if like is None else like.device, name)


def _caller() -> str:
    """The public function of this module that is running (for messages):
    the innermost caller whose name does not start with an underscore."""
    import sys
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_name.startswith(("_", "<")) or f.f_code.co_name == "f") \
            and f.f_globals is globals():
        f = f.f_back
    return f.f_code.co_name if f is not None and f.f_globals is globals() else "functional"


def _new_tensor(x, dtype, device, name):
    """A Tensor from a non-Tensor argument, or an error naming the function
    (None is not a tensor here: ``Tensor(None)`` would be a silent 0)."""
    if x is None:
        raise TypeError(f"{name or _caller()}: expected a tensor, got None")
    try:
        return Tensor(x, dtype=dtype, device=device)
    except (TypeError, ValueError) as exc:
        text = repr(x)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise type(exc)(f"{name or _caller()}: cannot use {type(x).__name__} {text} as a tensor: {exc}") from None


def _named(name: str, exc: BaseException) -> BaseException:
    """``exc`` with ``name: `` in front of its message (same class), for an
    error raised by an op inside a composite function."""
    text = str(exc)
    if text.startswith(f"{name}:"):
        return exc
    try:
        new = type(exc)(f"{name}: {text}")
    except Exception:
        return exc
    return new


_index = __import__("operator").index


def _int_or_err(name: str, what: str, v) -> int:
    """``v`` as an int: ints, NumPy ints, 0-d integer tensors and whole
    floats (never a fractional float or a string, which ``int()`` would
    truncate or misreport)."""
    try:
        return _index(v)
    except TypeError:
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return int(v)
        raise TypeError(f"{name}: {what} must be an int, got {type(v).__name__} {v!r}") from None


def _ints(name: str, what: str, seq) -> tuple:
    """A sequence of ints (as ``_int_or_err``) as a tuple."""
    try:
        return tuple([_index(d) for d in seq])
    except TypeError:
        pass
    try:
        items = list(seq)
    except TypeError:
        raise TypeError(f"{name}: {what} must be a sequence of ints, got {type(seq).__name__} {seq!r}") from None
    return tuple(_int_or_err(name, f"{what} entries", d) for d in items)


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


_BOOL = np.dtype(bool)


def where(mask, x, y):
    """``x`` where ``mask`` is true, else ``y``; ``mask`` is a bool tensor
    (as MegEngine: a float or int mask is an error, not a truthiness test)."""
    if isinstance(mask, (Tensor, np.ndarray)) and mask.dtype is not _BOOL and mask.dtype != _BOOL:
        raise TypeError(f"where: mask must be a bool tensor, got {mask.dtype} of shape {mask.shape} "
                        f"(compare first, e.g. F.where(x > 0, x, y))")
    return _apply(Elemwise("where"), mask, x, y)[0]


def clip(x, lower=None, upper=None):
    """Limit ``x`` to [lower, upper] (either may be None). The gradient
    passes where ``lower <= x <= upper``, bounds included (PyTorch's
    ``clamp``); a bound given as a tensor gets it where ``x`` is beyond it.

    Example::

        >>> F.clip(x, 0.0, 1.0)
    """
    x = _t(x)
    try:
        if lower is not None:
            x = where(lt(x, lower), lower, x)  # noqa: F821
        if upper is not None:
            x = where(gt(x, upper), upper, x)  # noqa: F821
    except (OpError, TypeError) as exc:     # a bound of the wrong shape or type
        raise _named("clip", exc) from exc
    return x


def copy(inp, device=None):
    """A recorded copy of ``inp`` (on ``device`` when given)."""
    out = _apply(Identity(), _t(inp))[0]
    return out if device is None else out.to(device)


def stop_gradient(x):
    """``x`` with no gradient flowing back through it."""
    return _apply(StopGradient(), _t(x))[0]


def astype(x, dtype):
    x = _t(x)
    dt = _numeric_dtype("astype", dtype)
    if x.dtype == dt:
        return x
    return _apply(_Cast(dt), x)[0]


def _numeric_dtype(name: str, dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype a tensor can hold (bool, integer, float,
    complex), or an error naming ``name`` (np.dtype(None) would be float64,
    np.dtype(str) a string tensor)."""
    if dtype is None:
        raise TypeError(f"{name}: dtype must be given, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None
    if dt.kind not in "biufc":
        raise TypeError(f"{name}: cannot make a tensor of dtype {dt} (from {dtype!r}); "
                        f"use a bool, integer or floating-point dtype")
    return dt


# ---- reductions
class AxisError(OpError, AssertionError):
    """An axis given twice: an ``OpError`` (a ValueError) here, and the
    AssertionError MegEngine raises for it."""


def _reduce(mode):
    def f(inp, axis=None, keepdims: bool = False):
        x = _t(inp, name=mode)
        if isinstance(axis, (tuple, list)) and x.shape is not None and x.ndim:
            seen = [_int_or_err(mode, "axis", a) % x.ndim for a in axis]
            if len(set(seen)) != len(seen):
                raise AxisError(f"{mode}: axis {tuple(axis)} names an axis twice (input shape {x.shape})")
        return _apply(_Reduce(mode, _axis_key(axis), bool(keepdims)), x)[0]
    f.__name__ = mode
    f.__doc__ = f"{mode} over ``axis`` (None: every axis).\n\nExample::\n\n    >>> F.{mode}(x, axis=1, keepdims=True)\n"
    return f


sum = _reduce("sum")    # noqa: A001
mean = _reduce("mean")
max = _reduce("max")    # noqa: A001
min = _reduce("min")    # noqa: A001
prod = _reduce("prod")


def _arg_reduce(mode, inp, axis, keepdims):
    x = _t(inp)
    if not isinstance(axis, (tuple, list)):
        return _apply(_ArgReduce(mode, axis, bool(keepdims)), x)[0]
    # MegEngine's rule for several axes: one arg-reduction per axis, the
    # last axis first, each applied to the previous result
    axes = sorted({_axis_in(mode, a, x.ndim) for a in axis}, reverse=True)
    if len(axes) != len(axis):
        raise AxisError(f"{mode}: axis {tuple(axis)} names an axis twice (input shape {x.shape})")
    for a in axes:
        x = _apply(_ArgReduce(mode, a, bool(keepdims)), x)[0]
    return x


def argmax(inp, axis=None, keepdims: bool = False):
    """Index of the largest element along ``axis`` (None: flattened), int32.
    For a sequence of axes, as MegEngine: argmax over each in turn, the
    last axis first (each step on the previous step's indices)."""
    return _arg_reduce("argmax", inp, axis, keepdims)


def argmin(inp, axis=None, keepdims: bool = False):
    """Index of the smallest element along ``axis`` (None: flattened), int32;
    a sequence of axes as in ``argmax``."""
    return _arg_reduce("argmin", inp, axis, keepdims)


def cumsum(inp, axis: int = 0):
    """Cumulative sum along ``axis``.

    Example::

        >>> F.cumsum(x, axis=1)
    """
    return _apply(_CumSum(axis, False), _t(inp))[0]


# ---- linear algebra
def matmul(inp1, inp2, transpose_a: bool = False, transpose_b: bool = False,
           compute_mode: str = "default"):
    """Matrix product with NumPy's rules for 1-D operands and broadcast batch axes.
    ``compute_mode`` is accepted for MegEngine compatibility (a float16
    precision hint) and changes nothing here.

    Example::

        >>> F.matmul(a, b, transpose_b=True)
    """
    a, b = _t(inp1), _t(inp2)
    sa, sb = a.ndim == 1, b.ndim == 1
    if (sa or sb) and a.shape is not None and b.shape is not None and b.ndim and a.ndim:
        # checked here, so that the error shows the vectors as given (not as matrices)
        ka = a.shape[-2 if transpose_a and not sa else -1]
        kb = b.shape[-1 if transpose_b and not sb else (0 if sb else -2)]
        if isinstance(ka, int) and isinstance(kb, int) and ka != kb:
            raise ValueError(f"matmul: inner dimensions differ ({ka} and {kb}) for shapes "
                             f"{a.shape} and {b.shape}")
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
    if a.ndim > 1 or b.ndim > 1 or (a.ndim == 1 and b.ndim == 1 and a.shape != b.shape):
        raise ValueError(f"dot: expects vectors of the same length, got shapes {a.shape} and {b.shape}")
    return sum(a * b)


# ---- shapes
def reshape(inp, target_shape: Sequence[int]):
    if isinstance(target_shape, int):
        target_shape = (target_shape,)
    return _apply(_Reshape(_ints("reshape", "target_shape", target_shape)), _t(inp))[0]


def transpose(inp, pattern: Optional[Sequence[int]] = None):
    """``inp`` with its axes permuted by ``pattern`` (reversed when None). As
    in MegEngine, an ``'x'`` in the pattern adds an axis of size 1, and an
    axis of size 1 may be left out.

    Example::

        >>> F.transpose(gc.tensor(np.zeros((2, 3))), (1, "x", 0)).shape
        (3, 1, 2)
    """
    x = _t(inp)
    if pattern is None:
        pattern = tuple(range(x.ndim))[::-1]
    pattern = tuple(pattern)
    if any(isinstance(p, str) for p in pattern) or 0 < len(pattern) < x.ndim:
        from .tensor_methods import dimshuffle
        return dimshuffle(x, pattern)
    try:
        pattern = tuple(operator.index(p) for p in pattern)
    except TypeError:
        raise TypeError(f"transpose: pattern entries must be ints (or 'x'), got {pattern}") from None
    return _apply(_Transpose(pattern), x)[0]


class ShapeError(OpError, RuntimeError):
    """A shape that does not fit an op: an ``OpError`` (a ValueError) here,
    and the RuntimeError MegEngine raises for the same input."""


def broadcast_to(inp, shape: Sequence[int]):
    """``inp`` broadcast to ``shape``; as in MegEngine, a ``None`` in
    ``shape`` keeps the size of the matching (right-aligned) axis of ``inp``.

    Example::

        >>> F.broadcast_to(gc.tensor(np.zeros((1, 2, 3))), (4, None, 3)).shape
        (4, 2, 3)
    """
    x = _t(inp)
    if isinstance(shape, Tensor):
        shape = shape.numpy().reshape(-1).tolist()
    elif isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = list(shape)
    except TypeError:
        raise TypeError(f"broadcast_to: shape must be a sequence of ints, got {shape!r}") from None
    for i, d in enumerate(shape):
        if d is None:
            lead = len(shape) - x.ndim
            if i < lead:
                raise ValueError(f"broadcast_to: None at position {i} of {tuple(shape)} has no axis of "
                                 f"inp (shape {x.shape}) to take its size from")
            shape[i] = x.shape[i - lead]
        elif _int_or_err("broadcast_to", "shape entries", d) < 0:
            raise ValueError(f"broadcast_to: sizes must be >= 0 (or None to keep the input's), got {tuple(shape)}")
    try:
        return _apply(_Broadcast(_ints("broadcast_to", "shape", shape)), x)[0]
    except OpError as exc:
        raise ShapeError(str(exc)) from None


def expand_dims(inp, axis):
    try:
        return _apply(_ExpandDims(_axis_key(axis)), _t(inp))[0]
    except OpError as exc:       # an axis out of range: MegEngine's RuntimeError too
        raise ShapeError(str(exc)) from None
    except (TypeError, ValueError):      # an axis that is no int: 'a', 1.5, None
        _check_axes("expand_dims", axis)
        raise


def squeeze(inp, axis=None):
    try:
        return _apply(_Squeeze(_axis_key(axis)), _t(inp))[0]
    except (TypeError, ValueError) as exc:
        if not isinstance(exc, OpError) and axis is not None:
            _check_axes("squeeze", axis)
        raise


def _check_axes(name: str, axis) -> None:
    """A TypeError naming ``name`` when ``axis`` is not an int or a sequence
    of ints (called after an op rejected it with a less helpful message)."""
    if isinstance(axis, (tuple, list)):
        _ints(name, "axis", axis)
    else:
        _int_or_err(name, "axis", axis)


def flatten(inp, start_axis: int = 0, end_axis: int = -1):
    x = _t(inp)
    nd = x.ndim
    if nd == 0:
        return reshape(x, (1,))
    s, e = _axis_in("flatten", start_axis, nd), _axis_in("flatten", end_axis, nd)
    if s > e:
        raise ValueError(f"flatten: start_axis {start_axis} comes after end_axis {end_axis} "
                         f"for a tensor of shape {x.shape}")
    shape = x.shape[:s] + (-1,) + x.shape[e + 1:]
    return reshape(x, shape)


def concat(inps, axis: int = 0, device=None):
    """Join tensors along an existing ``axis``; ``device`` (MegEngine's
    argument) moves the result there."""
    out = _apply(_Concat(_int_or_err("concat", "axis", axis)), *_tensor_list("concat", inps))[0]
    return out if device is None else out.to(device)


def _tensor_list(name: str, inps) -> list:
    """The tensors of a list argument (concat, stack): a list or tuple of at
    least one; a Tensor itself is not iterated (that would use its rows)."""
    if not isinstance(inps, (list, tuple)):
        if isinstance(inps, Tensor) or not hasattr(inps, "__iter__"):
            raise TypeError(f"{name}: expects a list of tensors, got {type(inps).__name__}")
        inps = list(inps)
    if not inps:
        raise ValueError(f"{name}: expects at least one tensor, got an empty list")
    return [_t(x, name=name) for x in inps]


# ---- indexing
def getitem(x, index):
    spec, arrays = split_index(index)
    arrays = [_on(a if isinstance(a, Tensor) else np.asarray(a), x) for a in arrays]
    return _apply(_Subtensor(spec), x, *arrays)[0]


def setitem(x, index, value):
    """A copy of ``x`` with ``value`` written at ``index`` (recorded)."""
    spec, arrays = split_index(index)
    arrays = [_on(a if isinstance(a, Tensor) else np.asarray(a), x) for a in arrays]
    value = value if isinstance(value, Tensor) else _value_like("setitem", value, x)
    if value.dtype != x.dtype:
        value = astype(value, x.dtype)
    return _apply(_SetSubtensor(spec), x, value, *arrays)[0]


def _value_like(name: str, value, x):
    """A non-Tensor ``value`` as a Tensor of ``x``'s dtype and device, or an
    error naming ``name`` (None would silently become NaN, a string a NumPy
    conversion error)."""
    if value is None:
        raise TypeError(f"{name}: the value is None; give a number or a tensor")
    try:
        return Tensor(np.asarray(value, x.dtype), device=x.device)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: cannot use {type(value).__name__} {value!r:.60} as a value for a tensor "
                        f"of dtype {x.dtype} and shape {x.shape}: {exc}") from None


def indexing_one_hot(src, index, axis: int = 1, keepdims: bool = False):
    """``src[i, index[i]]`` along ``axis``.

    Example::

        >>> F.indexing_one_hot(logits, labels)     # (N, C), (N,) -> (N,)
    """
    src = _t(src)
    index = _int_labels(_on(index, src), "indexing_one_hot", "index")
    if src.shape is not None:
        _axis_in("indexing_one_hot", axis, src.ndim)      # no silent wrap of axis=5 onto axis 1
    return _apply(_IndexingOneHot(_int_or_err("indexing_one_hot", "axis", axis), bool(keepdims)), src, index)[0]


def _int_labels(label, name: str, what: str):
    """Integer class indices; float ones holding whole numbers are cast to
    int32, as MegEngine does (its own examples pass float labels)."""
    kind = label.dtype.kind
    if kind in "iu":
        return label
    if kind != "f":
        raise TypeError(f"{name}: {what} must be an integer tensor, got {label.dtype} of shape {label.shape}")
    if isinstance(label, Tensor):
        values = label.numpy()
        if not np.all(np.isfinite(values) & (values == np.round(values))):
            raise TypeError(f"{name}: {what} must hold whole class indices, got {label.dtype} values "
                            f"that are not integers (shape {label.shape})")
    return astype(label, np.int32)


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
        sections = _ints("split", "nsplits_or_sections", nsplits_or_sections)
    return list(_apply(_Split(_int_or_err("split", "axis", axis), sections), _t(inp)))


def stack(inps, axis: int = 0, device=None):
    """Stack equally shaped tensors along a new ``axis`` (``device``, as in
    MegEngine, moves the result there).

    Example::

        >>> F.stack([x, y], axis=1)         # (3,), (3,) -> (3, 2)
    """
    out = _apply(_Stack(_int_or_err("stack", "axis", axis)), *_tensor_list("stack", inps))[0]
    return out if device is None else out.to(device)


def gather(inp, axis: int, index):
    """``out[i][j] = inp[i][index[i][j]]`` for axis 1 (torch.gather): ``index``
    is an integer tensor of ``inp``'s rank, no larger than ``inp`` outside
    ``axis``; the result has ``index``'s shape.

    Example::

        >>> F.gather(x, 1, gc.tensor([[0, 0], [1, 0]]))
    """
    x = _t(inp)
    return _apply(_Gather(_int_or_err("gather", "axis", axis)), x, _on(index, x))[0]


def scatter(inp, axis: int, index, source):
    """A copy of ``inp`` with ``out[i][index[i][j]] = source[i][j]`` for axis 1
    (torch.scatter, not accumulating). ``source`` is cast to ``inp``'s dtype.

    Example::

        >>> F.scatter(x, 0, gc.tensor([[1, 0, 2]]), src)
    """
    x = _t(inp)
    src = source if isinstance(source, Tensor) or hasattr(source, "trace") else _value_like("scatter", source, x)
    if src.dtype != x.dtype:
        src = astype(src, x.dtype)
    return _apply(_Scatter(_int_or_err("scatter", "axis", axis)), x, _on(index, x), src)[0]


def sort(inp, descending: bool = False, axis: int = -1):
    """``(sorted, indices)`` along ``axis`` (the last by default, as newer
    MegEngine's ``F.sort(inp, descending, axis)``); a stable sort, indices
    int32.

    Example::

        >>> values, indices = F.sort(x, descending=True)
    """
    x = _t(inp)
    last = -1 if x.shape is None or x.ndim == 0 else x.ndim - 1
    ax = -1 if last < 0 or axis in (-1, last) else _axis_in("sort", axis, x.ndim)
    if ax in (-1, last):
        return _apply(_Sort(bool(descending)), x)
    values, indices = _apply(_Sort(bool(descending)), swapaxes(x, ax, -1))
    return swapaxes(values, ax, -1), swapaxes(indices, ax, -1)


def topk(inp, k: int, descending: bool = False, kth_only: bool = False, no_sort: bool = False):
    """``(values, indices)`` of the ``k`` smallest elements along the last
    axis (the largest with ``descending=True``), MegEngine's ``F.topk``:
    ``kth_only`` returns only the k-th one (the last axis removed),
    ``no_sort`` returns them in index order. Indices are int32.

    Example::

        >>> values, indices = F.topk(x, 3, descending=True)
    """
    mode = "kth_only" if kth_only else "no_sort" if no_sort else "sorted"
    return _apply(_TopK(_int_or_err("topk", "k", k), bool(descending), mode), _t(inp))


# ---- creation
def _host(name: str, make, **args):
    """``make()`` (a NumPy constructor call), with its TypeError or
    ValueError (a negative size, a string, an unknown dtype) naming ``name``
    and the arguments."""
    try:
        return make()
    except (TypeError, ValueError, MemoryError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in args.items())
        base = TypeError if isinstance(exc, TypeError) else ValueError if isinstance(exc, ValueError) else MemoryError
        try:
            new = exc.__class__(f"{exc} (got {given})") if base is not MemoryError else None
        except Exception:
            new = None
        raise _named(name, new if isinstance(new, base) else base(f"{exc} (got {given})")) from None


def zeros(shape, dtype="float32", device=None):
    return Tensor(_host("zeros", lambda: np.zeros(shape, dtype), shape=shape, dtype=dtype), device=device)


def ones(shape, dtype="float32", device=None):
    return Tensor(_host("ones", lambda: np.ones(shape, dtype), shape=shape, dtype=dtype), device=device)


def _fill_value(name: str, value, dtype) -> None:
    """None, or NaN/inf into an integer or bool dtype (NumPy would write
    garbage such as INT_MIN), is an error naming ``name``."""
    if value is None:
        raise TypeError(f"{name}: value is None; give a number")
    if isinstance(value, (float, np.floating)) and not np.isfinite(value) and np.dtype(dtype).kind in "biu":
        raise ValueError(f"{name}: cannot fill a {np.dtype(dtype)} tensor with {value}")


def full(shape, value, dtype=None, device=None):
    """A tensor of ``shape`` filled with ``value``. Without ``dtype`` it comes
    from the value as in MegEngine: bool, int32 for an int, float32 for a float."""
    if dtype is None:
        dtype = _t(value, name="full").dtype
    _host("full", lambda: _fill_value("full", value, dtype), dtype=dtype)   # (dtype may be unknown)
    return Tensor(_host("full", lambda: np.full(shape, value, dtype), shape=shape, value=value, dtype=dtype),
                  device=device)


def zeros_like(inp):
    inp = _t(inp, name="zeros_like")
    return Tensor(np.zeros(inp.shape, inp.dtype), device=inp.device)


def ones_like(inp):
    inp = _t(inp, name="ones_like")
    return Tensor(np.ones(inp.shape, inp.dtype), device=inp.device)


def arange(start=0, stop=None, step=1, dtype="float32", device=None):
    if step == 0:
        raise ValueError("arange: step must not be 0")
    if stop is None:
        start, stop = 0, start
    return Tensor(_host("arange", lambda: np.arange(start, stop, step, dtype=dtype),
                        start=start, stop=stop, step=step, dtype=dtype), device=device)


def linspace(start, stop, num, dtype="float32", device=None):
    num = _int_or_err("linspace", "num", num)
    if num < 0:
        raise ValueError(f"linspace: num must be >= 0, got {num}")
    return Tensor(_host("linspace", lambda: np.linspace(start, stop, num, dtype=dtype),
                        start=start, stop=stop, num=num, dtype=dtype), device=device)


def eye(N, M=None, dtype="float32", device=None):
    """An (N, M) matrix (M defaults to N) with ones on the diagonal. As in
    MegEngine, ``N`` may also be the shape: ``(N,)``, ``(N, M)`` or a 1-d
    integer Tensor holding it (``F.eye(x.shape)``)."""
    if M is None and not isinstance(N, (int, np.integer, float, np.floating)):
        if N is None:
            raise TypeError("eye: N must be an int or a shape, got None")
        shape = _ints("eye", "shape", np.asarray(N.numpy() if isinstance(N, Tensor) else N).reshape(-1).tolist())
        if len(shape) not in (1, 2):
            raise ValueError(f"eye: a shape must have 1 or 2 elements, got {N!r}")
        N, M = shape[0], shape[-1]
    N, M = _int_or_err("eye", "N", N), None if M is None else _int_or_err("eye", "M", M)
    if N < 0 or (M is not None and M < 0):
        raise ValueError(f"eye: N and M must be >= 0, got N={N}, M={M}")
    return Tensor(np.eye(N, M, dtype=dtype), device=device)


# ---- nn
def log_softmax(inp, axis: int = -1):
    """log(softmax(x)) along ``axis`` (an int or a sequence of axes)."""
    x = _t(inp)
    if isinstance(axis, (tuple, list)):
        try:
            return x - logsumexp(x, axis, True)
        except OpError as exc:
            raise _named("log_softmax", exc) from exc
    return _apply(_LogSoftmax(axis), x)[0]


logsoftmax = log_softmax     # MegEngine 1.x's name


def logsumexp(inp, axis: int = -1, keepdims: bool = False):
    """log(sum(exp(x))) over ``axis``: an int, a sequence of axes (as in
    MegEngine) or None (every axis)."""
    x = _t(inp)
    if axis is None or isinstance(axis, (tuple, list)):
        # the LogSumExp op's decomposition, over several axes at once
        try:
            m = stop_gradient(max(x, _axis_key(axis), True))
        except (OpError, TypeError) as exc:      # an axis out of range or not an int
            raise _named("logsumexp", exc) from exc
        m = where(eq(abs(m), float("inf")), 0, m)  # noqa: F821 - as LogSumExp: no inf - inf
        s = sum(exp(x - m), _axis_key(axis), keepdims)  # noqa: F821
        return log(s) + (m if keepdims else reshape(m, s.shape))  # noqa: F821
    return _apply(_LogSumExp(axis, bool(keepdims)), x)[0]


def leaky_relu(inp, negative_slope: float = 0.01):
    """``x`` where positive, ``negative_slope * x`` elsewhere."""
    x = _t(inp)
    try:
        return where(gt(x, 0), x, x * negative_slope)  # noqa: F821
    except (OpError, TypeError) as exc:       # a slope that is no number
        raise _named("leaky_relu", exc) from exc


def softmax(inp, axis=None):
    """exp(x) / sum(exp(x)) along ``axis`` (an int or a sequence of axes).
    The default axis is MegEngine's: 0 for a 0-, 1- or 3-d input, else 1.

    Example::

        >>> F.softmax(x)               # (N, C) or (N, C, H, W): over C
    """
    x = _t(inp)
    if axis is None:
        axis = 0 if x.ndim in (0, 1, 3) else 1
    if isinstance(axis, (tuple, list)):
        try:
            e = exp(x - stop_gradient(max(x, _axis_key(axis), True)))  # noqa: F821
        except (OpError, TypeError) as exc:
            raise _named("softmax", exc) from exc
        return e / sum(e, _axis_key(axis), True)
    return _apply(_Softmax(axis), x)[0]


def cross_entropy(pred, label, axis: int = 1, with_logits: bool = True,
                  label_smooth: float = 0.0, reduction: str = "mean"):
    """Cross-entropy of class scores ``pred`` (logits by default) against
    integer ``label``, MegEngine's ``F.nn.cross_entropy``.

    Example::

        >>> loss = F.cross_entropy(logits, labels)
    """
    pred = _t(pred)
    label = _on(label, pred)
    label = _int_labels(label, "cross_entropy", "label")
    if isinstance(label, Tensor) and label.device == "cpu" and label.size and label.numpy().min() < 0:
        # indexing would count a negative class from the end (NumPy's rule) and
        # score the wrong class silently; on cuda this check would cost a sync
        raise ValueError(f"cross_entropy: labels must be class indices >= 0, got {label.numpy().min()} "
                         f"(label shape {label.shape}, pred shape {pred.shape})")
    if label.ndim != pred.ndim - 1:
        raise ValueError(f"cross_entropy: label must have one dimension less than pred, "
                         f"got shapes {pred.shape} and {label.shape}")
    if pred.shape is not None:
        _axis_in("cross_entropy", axis, pred.ndim)
    if isinstance(label_smooth, bool) or not isinstance(label_smooth, (int, float, np.number)):
        raise TypeError(f"cross_entropy: label_smooth must be a number, got {label_smooth!r}")
    logp = log_softmax(pred, axis) if with_logits else log(pred)  # noqa: F821
    try:
        nll = -indexing_one_hot(logp, label, axis)
    except (OpError, IndexError) as exc:         # a label out of range
        raise _named("cross_entropy", exc) from exc
    if label_smooth:
        nll = nll * (1 - label_smooth) - mean(logp, axis) * label_smooth
    return _reduce_loss("cross_entropy", nll, reduction)


def _reduce_loss(name: str, loss: Tensor, reduction: str) -> Tensor:
    """Every loss's ``reduction``: "mean" or "sum" over all elements, or
    "none" (the elementwise loss as is)."""
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def linear(inp, weight, bias=None, compute_mode: str = "default"):
    """``inp @ weight.T + bias`` (weight is (out_features, in_features));
    ``compute_mode`` as in ``matmul``."""
    w = _t(weight, name="linear")
    if w.shape is not None and w.ndim != 2:
        raise ValueError(f"linear: weight must be 2-d (out_features, in_features), got shape {w.shape}")
    out = matmul(inp, w, transpose_b=True)
    if bias is None:
        return out
    try:
        return out + bias
    except (OpError, TypeError) as exc:     # a bias that does not fit (out_features,)
        raise _named("linear", exc) from exc


# ---- convolution and pooling (NCHW)
from .ops.conv import AvgPool2d as _AvgPool2dOp, Conv2d as _Conv2dOp, MaxPool2d as _MaxPool2dOp  # noqa: E402

_Conv2d, _MaxPool2d, _AvgPool2d = map(interned, (_Conv2dOp, _MaxPool2dOp, _AvgPool2dOp))


def _pair(v):
    # anything but an int or a pair of ints goes to the op as is, which says
    # what is wrong (int() would truncate 1.5 or misreport a string)
    try:
        if isinstance(v, (tuple, list)):
            return (_index(v[0]), _index(v[1])) if len(v) == 2 else tuple(v)
        v = _index(v)
        return (v, v)
    except TypeError:
        return tuple(v) if isinstance(v, (tuple, list)) else v


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
    out = _apply(_Conv2d(_pair(stride), _pair(padding), _pair(dilation), groups), x, w)[0]
    if bias is None:
        return out
    return _channel_bias("conv2d", out, _t(bias, out))


def _channel_bias(name: str, out: Tensor, bias: Tensor) -> Tensor:
    """``out + bias`` for a convolution's (N, O, ...) output: a 1-d bias is
    one per output channel (PyTorch's form) and must have O elements (it
    would otherwise broadcast along the last spatial axis); any other bias
    broadcasts, or the error names ``name``."""
    if bias.ndim == 1 and out.shape is not None and bias.shape[0] != 1:
        if bias.shape[0] != out.shape[1]:
            raise ValueError(f"{name}: a 1-d bias must have one element per output channel "
                             f"({out.shape[1]}), got shape {bias.shape} (output shape {out.shape})")
        bias = reshape(bias, (1, -1) + (1,) * (out.ndim - 2))
    try:
        return out + bias
    except OpError as exc:
        raise _named(name, exc) from exc


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
    try:
        m = mean(x, axis, True)
    except (OpError, TypeError) as exc:       # an axis out of range or not an int
        raise _named("var", exc) from exc
    d = x - m
    return mean(d * d, axis, keepdims)


def std(inp, axis=None, keepdims: bool = False):
    """Population standard deviation over ``axis``. Where it is 0 (constant
    data) the gradient is 0, as PyTorch's, not 0 * inf."""
    try:
        v = var(inp, axis, keepdims)
    except (OpError, TypeError) as exc:
        raise _named("std", exc) from exc
    zero = eq(v, 0)  # noqa: F821
    return where(zero, 0, sqrt(where(zero, 1, v)))  # noqa: F821


def norm(inp, ord: Optional[float] = None, axis=None, keepdims: bool = False):
    """Vector p-norm over ``axis`` (all elements when None); ``ord`` None is 2.

    Example::

        >>> F.norm(x, ord=2, axis=-1)
    """
    x = _t(inp)
    ord = _norm_ord("norm", ord)
    try:
        return _norm(x, ord, axis, keepdims)
    except (OpError, TypeError) as exc:       # an axis out of range or not an int
        raise _named("norm", exc) from exc


def _norm_ord(name: str, ord):
    """``ord`` as a number (None stays None; "inf" and "-inf" are
    accepted), or a TypeError naming ``name``."""
    if ord is None or (isinstance(ord, (int, float, np.number)) and not isinstance(ord, bool)):
        return ord
    if isinstance(ord, str):
        try:
            return float(ord)
        except ValueError:
            pass
    raise TypeError(f"{name}: ord must be a number (or None), got {ord!r}")


def _norm(x, ord, axis, keepdims):
    if ord is None or ord == 2:
        # the gradient at a zero vector is 0 (PyTorch's subgradient), not 0/0
        ss = sum(x * x, axis, keepdims)  # noqa: F821
        zero = eq(ss, 0)  # noqa: F821
        return where(zero, 0, sqrt(where(zero, 1, ss)))  # noqa: F821
    if ord == 1:
        return sum(abs(x), axis, keepdims)  # noqa: F821
    if ord == float("inf"):
        return max(abs(x), axis, keepdims)  # noqa: F821
    if ord == -float("inf"):
        return min(abs(x), axis, keepdims)  # noqa: F821
    if ord == 0:
        return sum(astype(ne(x, 0), x.dtype), axis, keepdims)  # noqa: F821
    # as for ord 2: a zero vector has norm 0 and gradient 0, not 0 * inf
    s = sum(abs(x) ** ord, axis, keepdims)  # noqa: F821
    zero = eq(s, 0)  # noqa: F821
    return where(zero, 0, where(zero, 1, s) ** (1.0 / ord))  # noqa: F821


def batch_norm(inp, running_mean=None, running_var=None, weight=None, bias=None, *,
               training: bool = False, momentum: float = 0.9, eps: float = 1e-5, inplace: bool = True,
               compute_mode: str = "default", param_dim: str = "dim_1c11"):
    """Batch normalisation over every axis but 1 (MegEngine's ``F.batch_norm``).

    In training the batch statistics normalise ``inp`` and, when given,
    ``running_mean``/``running_var`` are updated as ``momentum * running +
    (1 - momentum) * batch`` (the variance unbiased): in place, or, with
    ``inplace=False``, returned as ``(output, new_mean, new_var)`` (None for
    a statistic not given) and the buffers left alone. Otherwise (inference)
    both running statistics are required and used. ``compute_mode`` and
    ``param_dim`` ("dim_1c11" only) are MegEngine's and change nothing here.

    Example::

        >>> y = F.batch_norm(x, rm, rv, w, b, training=True)
    """
    if param_dim != "dim_1c11":
        raise ValueError(f"batch_norm: only param_dim='dim_1c11' (NCHW) is supported, got {param_dim!r}")
    x = _t(inp)
    if x.shape is not None:
        _check_channel_params(x, training, running_mean=running_mean, running_var=running_var,
                              weight=weight, bias=bias)
    axes = tuple(i for i in range(x.ndim) if i != 1)

    def per_channel(t):
        # MegEngine's parameters are (1, C, 1, 1); PyTorch's (C,) work too
        if t is None or x.ndim <= 2:
            return t
        t = _t(t)
        return t.reshape((1, -1) + (1,) * (x.ndim - 2)) if t.ndim == 1 else t
    weight, bias = per_channel(weight), per_channel(bias)
    stats = (running_mean, running_var)
    new_stats = [None, None]
    if training:
        m = mean(x, axes, True)
        d = x - m
        v = mean(d * d, axes, True)
        n = x.size // x.shape[1]
        for k, buf in enumerate(stats):
            if buf is not None:
                # history-free tensors: computed where x is, never recorded
                stat = m.detach() if k == 0 else v.detach() * (n / builtins_max(n - 1, 1))
                new = buf.detach() * momentum + stat.reshape(buf.shape) * (1 - momentum)
                new_stats[k] = new.astype(buf.dtype)
                if inplace:
                    buf._reset(new_stats[k])
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: running_mean and running_var must be given in inference "
                             "(training=False)")
        d = x - per_channel(running_mean)
        v = per_channel(running_var)
    y = d / sqrt(v + eps)  # noqa: F821
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    if training and not inplace and any(t is not None for t in stats):
        return y, new_stats[0], new_stats[1]
    return y


def _check_channel_params(x, training, **params) -> None:
    """batch_norm's checks before any op runs: inp is (N, C, ...), each given
    statistic or affine parameter has C elements (weight and bias may also
    be a single one), and the running statistics updated in training are
    Tensors."""
    if x.ndim < 2:
        raise ValueError(f"batch_norm: inp must be (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    for what, t in params.items():
        if t is None:
            continue
        running = what.startswith("running")
        if running and training and not isinstance(t, Tensor):
            raise TypeError(f"batch_norm: {what} must be a Tensor (it is updated in place in training), "
                            f"got {type(t).__name__}")
        shape = tuple(t.shape) if hasattr(t, "shape") else np.shape(t)
        size = int(np.prod(shape))
        if size != c and (running or size != 1):
            raise ValueError(f"batch_norm: {what} must have one element per channel ({c} for inp of shape "
                             f"{x.shape}), got shape {shape}")


def _check_drop_prob(name: str, drop_prob) -> None:
    try:
        ok = 0 <= drop_prob < 1
    except TypeError:
        raise TypeError(f"{name}: drop_prob must be a number in [0, 1), got {drop_prob!r}") from None
    if not ok:
        raise ValueError(f"{name}: drop_prob must be in [0, 1), got {drop_prob}")


def dropout(inp, drop_prob: float, training: bool = True):
    """Zero each element with probability ``drop_prob`` and scale the rest by
    ``1 / (1 - drop_prob)``; the identity when not training. The mask comes
    from ``gradcore.random`` (``gradcore.random.seed`` makes it repeatable).

    Example::

        >>> F.dropout(x, 0.5)
    """
    x = _t(inp)
    _check_drop_prob("dropout", drop_prob)
    if not training or drop_prob == 0:
        return x
    if x.dtype.kind not in "fc":
        # the 1 / (1 - p) scale would be truncated to an integer
        raise TypeError(f"dropout: needs a floating-point input, got {x.dtype} of shape {x.shape}")
    from . import random as _random
    keep = _random.generator().random(x.shape) >= drop_prob
    scale = np.asarray(1.0 / (1.0 - drop_prob), x.dtype)
    return x * Tensor(keep.astype(x.dtype) * scale, device=x.device)


# ---- more of MegEngine's functional API, each a composite of the ops above:
# gradients (first and higher order) and every device come from those ops
def _int_arg(name: str, what: str, v, low: Optional[int] = 0) -> int:
    """``v`` as an int no smaller than ``low`` (None: any), or a clear error
    naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: {what} must be an int, got {type(v).__name__} {v!r}")
    if low is not None and v < low:
        raise ValueError(f"{name}: {what} must be >= {low}, got {v}")
    return int(v)


def _int_tuple(name: str, what: str, v) -> tuple:
    """An int or a sequence of ints as a tuple of ints."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return (int(v),)
    try:
        items = tuple(v)
    except TypeError:
        raise TypeError(f"{name}: {what} must be an int or a sequence of ints, got {v!r}") from None
    return tuple(_int_arg(name, what, i, low=None) for i in items)


def _axis_in(name: str, axis, ndim: int) -> int:
    """``axis`` (negative counts from the end) as an index into ``ndim`` axes."""
    axis = _int_arg(name, "axis", axis, low=None)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


def isnan(inp: Tensor) -> Tensor:
    """True where ``inp`` is NaN (a bool tensor; never for integers).

    Example::

        >>> F.isnan(gc.tensor([1.0, float("nan")])).numpy()
        array([False,  True])
    """
    x = _t(inp)
    return ne(x, x)  # noqa: F821


def isinf(inp: Tensor) -> Tensor:
    """True where ``inp`` is +inf or -inf (a bool tensor).

    Example::

        >>> F.isinf(gc.tensor([1.0, -float("inf")])).numpy()
        array([False,  True])
    """
    return eq(abs(_t(inp)), float("inf"))  # noqa: F821


def full_like(inp: Tensor, value: Union[int, float]) -> Tensor:
    """A tensor of ``inp``'s shape, dtype and device filled with ``value``.

    Example::

        >>> F.full_like(gc.tensor([[1, 2], [3, 4]]), 7).numpy()
        array([[7, 7],
               [7, 7]], dtype=int32)
    """
    x = _t(inp)
    _fill_value("full_like", value, x.dtype)
    return Tensor(_host("full_like", lambda: np.full(x.shape, value, x.dtype), value=value, dtype=x.dtype),
                  device=x.device)


def one_hot(inp: Tensor, num_classes: int) -> Tensor:
    """One-hot encoding of the integer tensor ``inp``: a new last axis of
    length ``num_classes``, 1 at each label's position; int32.

    Example::

        >>> F.one_hot(gc.tensor([1, 3]), 4).numpy()
        array([[0, 1, 0, 0],
               [0, 0, 0, 1]], dtype=int32)
    """
    num_classes = _int_arg("one_hot", "num_classes", num_classes, low=1)
    x = _on(inp, None)
    if x.dtype.kind not in "iu":
        raise TypeError(f"one_hot: inp must be an integer tensor, got {x.dtype}")
    if isinstance(x, Tensor) and x.size:     # concrete labels (not symbolic ones in a trace)
        values = x.numpy()
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(f"one_hot: labels must be in [0, {num_classes}), got values in [{lo}, {hi}]")
    classes = arange(num_classes, dtype=x.dtype, device=x.device)
    return astype(eq(expand_dims(x, -1), classes), "int32")  # noqa: F821


def relu6(inp: Tensor) -> Tensor:
    """``min(max(x, 0), 6)``.

    Example::

        >>> F.relu6(gc.tensor([-1.0, 3.0, 8.0])).numpy()
        array([0., 3., 6.], dtype=float32)
    """
    # not clip(x, 0, 6): PyTorch's relu6 has gradient 0 at both kinks
    x = _t(inp)
    return where(ge(x, 6), 6, x * gt(x, 0) + 0.0)  # noqa: F821   (+ 0.0: no -0.0 below zero)


def hsigmoid(inp: Tensor) -> Tensor:
    """Hard sigmoid, ``relu6(x + 3) / 6``.

    Example::

        >>> F.hsigmoid(gc.tensor([-4.0, 0.0, 4.0])).numpy()
        array([0. , 0.5, 1. ], dtype=float32)
    """
    return relu6(_t(inp) + 3) / 6


def hswish(inp: Tensor) -> Tensor:
    """Hard swish, ``x * relu6(x + 3) / 6``.

    Example::

        >>> F.hswish(gc.tensor([0.0, 1.0, 4.0])).numpy()
        array([0.       , 0.6666667, 4.       ], dtype=float32)
    """
    x = _t(inp)
    return x * hsigmoid(x)


def elu(inp: Tensor, alpha: float = 1.0) -> Tensor:
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere (exp never
    sees a positive argument, so large inputs neither overflow nor poison
    the gradient).

    Example::

        >>> F.elu(gc.tensor([-1.0, 2.0])).numpy()
        array([-0.63212055,  2.        ], dtype=float32)
    """
    x = _t(inp)
    positive = gt(x, 0)  # noqa: F821
    # at 0 the gradient is alpha, torch's (minimum's tie would split it)
    try:
        return where(positive, x, expm1(where(positive, 0, x)) * alpha)  # noqa: F821
    except (OpError, TypeError) as exc:       # an alpha that is no number
        raise _named("elu", exc) from exc


def prelu(inp: Tensor, weight: Tensor) -> Tensor:
    """``max(x, 0) + weight * min(x, 0)``, MegEngine's ``F.nn.prelu``:
    ``weight`` broadcasts against ``inp`` (for one slope per channel of
    (N, C, H, W), give it shape (1, C, 1, 1) or (C, 1, 1)).

    Example::

        >>> F.prelu(gc.tensor([-2.0, 3.0]), gc.tensor([0.25])).numpy()
        array([-0.5,  3. ], dtype=float32)
    """
    x = _t(inp)
    # at 0 the gradient is weight, torch's (minimum's tie would split it)
    try:
        return where(gt(x, 0), x, x * _t(weight, x))  # noqa: F821
    except OpError as exc:        # a weight that does not broadcast against inp
        raise _named("prelu", exc) from exc


# ---- losses: ``reduction`` is "mean" (default), "sum" or "none"
def _label(label, pred: Tensor, name: Optional[str] = None) -> Tensor:
    """``label`` as a tensor of ``pred``'s dtype: the loss keeps ``pred``'s.
    With ``name`` (a loss), ``label`` must broadcast to ``pred``'s shape (a
    (N,) label against (N, 1) scores would silently make an (N, N) loss)."""
    label = astype(_t(label, pred), pred.dtype)
    if name is not None and label.shape != pred.shape and label.shape is not None and pred.shape is not None:
        try:
            shape = tuple(np.broadcast_shapes(pred.shape, label.shape))
        except ValueError:
            shape = None
        if shape != pred.shape:
            raise ValueError(f"{name}: label must have pred's shape (or broadcast to it), got shapes "
                             f"{pred.shape} and {label.shape}")
    return label


def l1_loss(pred: Tensor, label: Tensor, reduction: str = "mean") -> Tensor:
    """Mean absolute error, ``|pred - label|`` reduced.

    Example::

        >>> F.l1_loss(gc.tensor([3.0, 3.0]), gc.tensor([2.0, 8.0])).item()
        3.0
    """
    pred = _t(pred)
    return _reduce_loss("l1_loss", abs(pred - _label(label, pred, "l1_loss")), reduction)  # noqa: F821


def square_loss(pred: Tensor, label: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error, ``(pred - label) ** 2`` reduced (also ``F.mse_loss``).

    Example::

        >>> F.square_loss(gc.tensor([3.0, 3.0]), gc.tensor([2.0, 8.0])).item()
        13.0
    """
    pred = _t(pred)
    return _reduce_loss("square_loss", square(pred - _label(label, pred, "square_loss")), reduction)  # noqa: F821


mse_loss = square_loss


def binary_cross_entropy(pred: Tensor, label: Tensor, with_logits: bool = True,
                         reduction: str = "mean") -> Tensor:
    """Binary cross-entropy of ``pred`` against probabilities ``label`` (same
    shape). ``pred`` holds logits by default (computed stably as
    ``softplus(-pred) + (1 - label) * pred``); with ``with_logits=False`` it
    holds probabilities in (0, 1).

    Example::

        >>> F.binary_cross_entropy(gc.tensor([0.0, 0.0]), gc.tensor([1.0, 0.0])).item()
        0.6931471824645996
    """
    pred = _t(pred)
    label = _label(label, pred, "binary_cross_entropy")
    if with_logits:
        loss = softplus(-pred) + (1 - label) * pred  # noqa: F821
    else:
        loss = -(label * log(pred) + (1 - label) * log(1 - pred))  # noqa: F821
    return _reduce_loss("binary_cross_entropy", loss, reduction)


def hinge_loss(pred: Tensor, label: Tensor, norm: str = "L1", reduction: str = "mean") -> Tensor:
    """SVM hinge loss of scores ``pred`` (N, C) against labels of -1 or 1
    (same shape): per sample, the sum over axis 1 of ``max(0, 1 - pred *
    label)`` ("L1") or of its square ("L2"); then ``reduction`` over samples.

    Example::

        >>> pred = gc.tensor([[0.5, -0.5, 0.1], [-0.6, 0.7, 0.8]])
        >>> F.hinge_loss(pred, gc.tensor([[1.0, -1, -1], [-1, 1, 1]]), reduction="none").numpy()
        array([2.1, 0.9], dtype=float32)
    """
    kind = norm.upper() if isinstance(norm, str) else norm
    if kind not in ("L1", "L2"):
        raise ValueError(f"hinge_loss: norm must be 'L1' or 'L2', got {norm!r}")
    pred = _t(pred)
    if pred.ndim < 2:
        raise ValueError(f"hinge_loss: pred must be (N, C, ...), got shape {pred.shape}")
    margin = relu(1 - pred * _label(label, pred, "hinge_loss"))  # noqa: F821
    loss = sum(margin if kind == "L1" else square(margin), 1)  # noqa: F821
    return _reduce_loss("hinge_loss", loss, reduction)


def normalize(inp: Tensor, ord: Optional[float] = None, axis: Union[int, Sequence[int], None] = None,
              eps: float = 1e-12) -> Tensor:
    """``inp / max(norm(inp, ord, axis), eps)``: L``ord`` normalisation
    (default L2) of each vector along ``axis`` (None: the whole tensor as one
    vector). An all-zero vector stays zero, with a finite gradient.

    Example::

        >>> F.normalize(gc.tensor([[3.0, 4.0]]), axis=1).numpy()
        array([[0.6, 0.8]], dtype=float32)
    """
    x = _t(inp)
    if ord is None or ord == 2:
        # max(sqrt(s), eps) as sqrt(max(s, eps**2)): the same value, and no
        # 0 * inf in the gradient where s is 0
        try:
            ss = sum(x * x, axis, True)  # noqa: F821
        except (OpError, TypeError) as exc:
            raise _named("normalize", exc) from exc
        return x / sqrt(maximum(ss, eps * eps))  # noqa: F821
    try:
        n = norm(x, _norm_ord("normalize", ord), axis, True)
    except (OpError, TypeError) as exc:
        raise _named("normalize", exc) from exc
    return x / clip(n, lower=eps)


# ---- repeating and rolling (reshape, broadcast and split/concat)
def repeat(inp: Tensor, repeats: int, axis: Optional[int] = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``axis`` (None: of the
    flattened input), as ``np.repeat`` with an int ``repeats``.

    Example::

        >>> F.repeat(gc.tensor([[1, 2], [3, 4]]), 2, axis=1).numpy()
        array([[1, 1, 2, 2],
               [3, 3, 4, 4]], dtype=int32)
    """
    repeats = _int_arg("repeat", "repeats", repeats)
    x = _t(inp)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    ax = _axis_in("repeat", axis, x.ndim)
    shape = x.shape
    wide = broadcast_to(expand_dims(x, ax + 1), shape[:ax + 1] + (repeats,) + shape[ax + 1:])
    return reshape(wide, shape[:ax] + (shape[ax] * repeats,) + shape[ax + 1:])


def tile(inp: Tensor, reps: Sequence[int]) -> Tensor:
    """``inp`` repeated ``reps[i]`` times along axis ``i``, as ``np.tile``:
    the shorter of ``reps`` and the shape is padded with leading 1s.

    Example::

        >>> F.tile(gc.tensor([[1, 2], [3, 4]]), (2, 1)).numpy()
        array([[1, 2],
               [3, 4],
               [1, 2],
               [3, 4]], dtype=int32)
    """
    x = _t(inp)
    reps = tuple(_int_arg("tile", "reps", r) for r in _int_tuple("tile", "reps", reps))
    nd = builtins_max(len(reps), x.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - x.ndim) + x.shape
    pairs = list(zip(reps, shape))
    wide = broadcast_to(reshape(x, [v for _, d in pairs for v in (1, d)]), [v for p in pairs for v in p])
    return reshape(wide, tuple(r * d for r, d in pairs))


def roll(inp: Tensor, shift: Union[int, Sequence[int]],
         axis: Union[int, Sequence[int], None] = None) -> Tensor:
    """Shift elements by ``shift`` along ``axis``, wrapping around, as
    ``np.roll``: ``shift`` and ``axis`` may be matching sequences; with
    ``axis=None`` the flattened tensor is rolled and the shape restored.

    Example::

        >>> F.roll(gc.tensor([1, 2, 3, 4]), 1).numpy()
        array([4, 1, 2, 3], dtype=int32)
    """
    x = _t(inp)
    if axis is None:
        if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)):
            raise TypeError(f"roll: with axis=None, shift must be an int, got {shift!r}")
        return reshape(roll(reshape(x, (-1,)), shift, 0), x.shape)
    shifts, axes = _int_tuple("roll", "shift", shift), _int_tuple("roll", "axis", axis)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: shift {shift!r} and axis {axis!r} must have the same length")
    out = x
    for s, a in zip(shifts, axes):
        a = _axis_in("roll", a, x.ndim)
        n = x.shape[a]
        k = s % n if n else 0
        if k:
            head, tail = split(out, [n - k], a)
            out = concat([tail, head], a)
    return copy(x) if out is x else out


def embedding(inp: Tensor, weight: Tensor, padding_idx: Optional[int] = None,
              max_norm: Optional[float] = None, norm_type: Optional[float] = None) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by the integer tensor
    ``inp``: the result has shape ``inp.shape + (dim,)``. As in MegEngine,
    ``padding_idx``, ``max_norm`` and ``norm_type`` must be None.

    Example::

        >>> w = gc.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
        >>> F.embedding(gc.tensor([[2, 0]]), w).shape
        (1, 2, 2)
    """
    if padding_idx is not None or max_norm is not None or norm_type is not None:
        raise ValueError("embedding: padding_idx, max_norm and norm_type are not supported (give None)")
    w = _t(weight)
    idx = _on(inp, w)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: inp must be an integer tensor, got {idx.dtype}")
    if w.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-d (num_embeddings, dim), got shape {w.shape}")
    try:
        rows = getitem(w, reshape(idx, (-1,)))
    except (OpError, IndexError) as exc:      # an index >= num_embeddings
        raise _named("embedding", exc) from exc
    return reshape(rows, idx.shape + (w.shape[1],))


# ---- normalisation, padding, adaptive pooling and more of MegEngine's API
# (composites: gradients of any order and every device come from their ops)
def layer_norm(inp: Tensor, normalized_shape: Union[int, Sequence[int]], affine: bool = True,
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the last ``len(normalized_shape)`` axes,
    MegEngine's ``F.nn.layer_norm``: ``(x - mean) / sqrt(var + eps)`` with
    the biased variance, then ``* weight + bias`` when ``affine`` (both of
    ``normalized_shape``, or of its size).

    Example::

        >>> x = gc.tensor([[1.0, 2.0, 3.0]])
        >>> F.nn.layer_norm(x, 3, affine=False).numpy().round(4)
        array([[-1.2247,  0.    ,  1.2247]], dtype=float32)
    """
    x = _t(inp)
    shape = tuple(_int_arg("layer_norm", "normalized_shape", d, low=1)
                  for d in _int_tuple("layer_norm", "normalized_shape", normalized_shape))
    if not shape or len(shape) > x.ndim or x.shape[x.ndim - len(shape):] != shape:
        raise ValueError(f"layer_norm: normalized_shape {shape} must be the trailing dimensions "
                         f"of inp, got inp shape {x.shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    d = x - mean(x, axes, True)
    y = d / sqrt(mean(d * d, axes, True) + eps)  # noqa: F821
    if not affine:
        return y
    return y * _affine_param("layer_norm", "weight", weight, shape, x) + \
        _affine_param("layer_norm", "bias", bias, shape, x)


def _affine_param(name: str, what: str, t, shape: tuple, x: Tensor) -> Tensor:
    """An affine ``weight``/``bias`` reshaped to ``shape`` (it may come flat),
    or a clear error: None with ``affine=True``, or the wrong size."""
    if t is None:
        raise ValueError(f"{name}: affine=True needs {what} (give affine=False for none)")
    t = _t(t, x)
    if t.size != int(np.prod(shape)):
        raise ValueError(f"{name}: {what} must have shape {shape}, got {t.shape}")
    return t if t.shape == shape else reshape(t, shape)


def group_norm(inp: Tensor, num_groups: int, affine: bool = True, weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """Group normalisation of ``inp`` (N, C, ...), MegEngine's
    ``F.nn.group_norm``: the C channels split into ``num_groups`` groups,
    each sample's group normalised as in ``layer_norm``, then ``* weight +
    bias`` per channel (both (C,)) when ``affine``.

    Example::

        >>> x = gc.tensor([[[0.0, 2.0], [4.0, 6.0]]])       # (N, C, L) = (1, 2, 2)
        >>> F.nn.group_norm(x, 1, affine=False).numpy().round(4)
        array([[[-1.3416, -0.4472],
                [ 0.4472,  1.3416]]], dtype=float32)
    """
    x = _t(inp)
    g = _int_arg("group_norm", "num_groups", num_groups, low=1)
    if x.ndim < 2 or x.shape[1] % g:
        raise ValueError(f"group_norm: inp must be (N, C, ...) with C divisible by num_groups={g}, "
                         f"got shape {x.shape}")
    n, c = x.shape[:2]
    grouped = reshape(x, (n, g, (c // g) * int(np.prod(x.shape[2:]))))
    d = grouped - mean(grouped, 2, True)
    y = reshape(d / sqrt(mean(d * d, 2, True) + eps), x.shape)  # noqa: F821
    if not affine:
        return y
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    w = reshape(_affine_param("group_norm", "weight", weight, (c,), x), per_channel)
    b = reshape(_affine_param("group_norm", "bias", bias, (c,), x), per_channel)
    return y * w + b


def _pad_widths(name: str, pad_width, ndim: int) -> list:
    """MegEngine's ``pad_width``: one (before, after) pair of ints >= 0 per
    leading axis (the axes after those given are not padded)."""
    try:
        pairs = [tuple(p) for p in pad_width]
    except TypeError:
        raise TypeError(f"{name}: pad_width must be a sequence of (before, after) pairs, "
                        f"got {pad_width!r}") from None
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"{name}: pad_width must be a sequence of (before, after) pairs, got {pad_width!r}")
    if len(pairs) > ndim:
        raise ValueError(f"{name}: pad_width has {len(pairs)} pairs, more than the {ndim} axes of inp")
    return [tuple(_int_arg(name, "pad_width", v) for v in p) for p in pairs]


def pad(src: Tensor, pad_width: Sequence[Sequence[int]], mode: str = "constant",
        constant_value: float = 0.0) -> Tensor:
    """Pad ``src``, MegEngine's ``F.nn.pad``: ``pad_width[i] = (before,
    after)`` for axis ``i`` (later axes unpadded). ``mode`` is "constant"
    (``constant_value``), "reflect" (mirrored, edge not repeated, as
    ``np.pad``'s "reflect") or "replicate" (also "edge": the edge repeated).

    Example::

        >>> F.nn.pad(gc.tensor([[1.0, 2.0, 3.0]]), ((0, 0), (1, 2)), mode="reflect").numpy()
        array([[2., 1., 2., 3., 2., 1.]], dtype=float32)
    """
    x = _t(src)
    kind = mode.lower() if isinstance(mode, str) else mode
    kind = "replicate" if kind == "edge" else kind
    if kind not in ("constant", "reflect", "replicate"):
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'edge', got {mode!r}")
    out = x
    if kind == "constant":
        _fill_value("pad", constant_value, x.dtype)
        _host("pad", lambda: np.asarray(constant_value, x.dtype), constant_value=constant_value, dtype=x.dtype)
    for axis, (before, after) in enumerate(_pad_widths("pad", pad_width, x.ndim)):
        if not (before or after):
            continue
        n = x.shape[axis]
        if kind == "constant":
            head, tail = (Tensor(np.full(out.shape[:axis] + (w,) + out.shape[axis + 1:], constant_value, x.dtype),
                                 device=x.device) for w in (before, after))
            out = concat([head, out, tail], axis)
            continue
        if n == 0:
            raise ValueError(f"pad: cannot {kind}-pad axis {axis} of size 0 (inp shape {x.shape})")
        # the source index of each output position along the axis: reflect
        # is periodic with period 2(n - 1), as np.pad's
        idx = np.arange(-before, n + after)
        if kind == "replicate" or n == 1:
            idx = np.clip(idx, 0, n - 1)
        else:
            idx = np.abs(idx) % (2 * (n - 1))
            idx = np.where(idx >= n, 2 * (n - 1) - idx, idx)
        out = getitem(out, (slice(None),) * axis + (idx,))
    return copy(x) if out is x else out


def _oshp(name: str, x: Tensor, oshp) -> tuple:
    if x.ndim != 4:
        raise ValueError(f"{name}: inp must be (N, C, H, W), got shape {x.shape}")
    if isinstance(oshp, Tensor):
        oshp = [int(v) for v in oshp.numpy().reshape(-1)]
    o = _int_tuple(name, "oshp", oshp)
    o = o * 2 if len(o) == 1 else o
    if len(o) != 2 or not all(1 <= v <= s for v, s in zip(o, x.shape[2:])):
        raise ValueError(f"{name}: oshp must be an int or (OH, OW), each in [1, input size], "
                         f"got {oshp!r} for inp shape {x.shape}")
    return o


def _adaptive_window(name: str, x: Tensor, oshp) -> tuple:
    """MegEngine's adaptive pooling window: stride ``in // out`` and window
    ``in - (out - 1) * stride`` per axis (the same bins as PyTorch's when
    ``out`` divides ``in``; otherwise equal windows, overlapping)."""
    o = _oshp(name, x, oshp)
    stride = tuple(i // v for i, v in zip(x.shape[2:], o))
    return tuple(i - (v - 1) * s for i, v, s in zip(x.shape[2:], o, stride)), stride


def adaptive_avg_pool2d(inp: Tensor, oshp: Union[int, Sequence[int], Tensor]) -> Tensor:
    """Average pooling of ``inp`` (N, C, H, W) to ``oshp`` = (OH, OW) (or an
    int for both), MegEngine's ``F.nn.adaptive_avg_pool2d``: a pooling of
    stride ``H // OH`` and window ``H - (OH - 1) * stride`` (likewise W).

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.nn.adaptive_avg_pool2d(x, 2).numpy()
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]], dtype=float32)
    """
    x = _t(inp)
    window, stride = _adaptive_window("adaptive_avg_pool2d", x, oshp)
    return avg_pool2d(x, window, stride, 0)


def adaptive_max_pool2d(inp: Tensor, oshp: Union[int, Sequence[int], Tensor]) -> Tensor:
    """Max pooling of ``inp`` (N, C, H, W) to ``oshp`` = (OH, OW) (or an int
    for both), MegEngine's ``F.nn.adaptive_max_pool2d``: windows as in
    ``adaptive_avg_pool2d``.

    Example::

        >>> x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
        >>> F.nn.adaptive_max_pool2d(x, (1, 2)).numpy()
        array([[[[13., 15.]]]], dtype=float32)
    """
    x = _t(inp)
    window, stride = _adaptive_window("adaptive_max_pool2d", x, oshp)
    return max_pool2d(x, window, stride, 0)


def conv1d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: int = 1, padding: int = 0,
           dilation: int = 1, groups: int = 1, conv_mode: str = "cross_correlation",
           compute_mode: str = "default") -> Tensor:
    """1-D convolution (cross-correlation) of ``inp`` (N, C, L) with
    ``weight`` (O, C // groups, K) (or grouped, (groups, O // groups, C //
    groups, K)), MegEngine's ``F.nn.conv1d``: ``conv2d`` on a trailing axis
    of size 1. ``bias`` broadcasts against (N, O, OL), e.g. (1, O, 1); a
    (O,) bias is one per channel.

    Example::

        >>> x = gc.tensor(np.arange(5, dtype="float32").reshape(1, 1, 5))
        >>> F.nn.conv1d(x, gc.tensor([[[1.0, -1.0]]])).numpy()
        array([[[-1., -1., -1., -1.]]], dtype=float32)
    """
    x, w = _t(inp), _t(weight)
    if x.ndim != 3:
        raise ValueError(f"conv1d: inp must be (N, C, L), got shape {x.shape}")
    if w.ndim not in (3, 4):
        raise ValueError(f"conv1d: weight must be (O, C // groups, K) or (groups, O // groups, "
                         f"C // groups, K), got shape {w.shape}")
    s, p, d = (_one_int("conv1d", what, v, low) for what, v, low in
               (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    out = conv2d(expand_dims(x, -1), expand_dims(w, -1), None, (s, 1), (p, 0), (d, 1), groups,
                 conv_mode, compute_mode)
    out = squeeze(out, -1)
    if bias is None:
        return out
    return _channel_bias("conv1d", out, _t(bias, out))


def _one_int(name: str, what: str, v, low: int) -> int:
    """An int, or a sequence holding one int (a 1-d ``stride=(2,)``)."""
    t = _int_tuple(name, what, v)
    if len(t) != 1:
        raise ValueError(f"{name}: {what} must be an int, got {v!r}")
    return _int_arg(name, what, t[0], low)


def pixel_shuffle(inp: Tensor, upscale_factor: int) -> Tensor:
    """Rearrange (..., C * r * r, H, W) into (..., C, H * r, W * r) for
    ``r = upscale_factor``, MegEngine's ``F.nn.pixel_shuffle`` (PyTorch's
    element order).

    Example::

        >>> x = gc.tensor(np.arange(4, dtype="float32").reshape(1, 4, 1, 1))
        >>> F.nn.pixel_shuffle(x, 2).numpy()
        array([[[[0., 1.],
                 [2., 3.]]]], dtype=float32)
    """
    r = _int_arg("pixel_shuffle", "upscale_factor", upscale_factor, low=1)
    x = _t(inp)
    if x.ndim < 3 or x.shape[-3] % (r * r):
        raise ValueError(f"pixel_shuffle: inp must be (..., C * {r * r}, H, W) for upscale_factor={r}, "
                         f"got shape {x.shape}")
    lead, (c, h, w) = x.shape[:-3], x.shape[-3:]
    y = reshape(x, (int(np.prod(lead)), c // (r * r), r, r, h, w))
    y = transpose(y, (0, 1, 4, 2, 5, 3))       # (n, c, h, r, w, r)
    return reshape(y, lead + (c // (r * r), h * r, w * r))


_topk = topk     # topk_accuracy's argument ``topk`` hides the function


def topk_accuracy(logits: Tensor, target: Tensor,
                  topk: Union[int, Sequence[int]] = 1) -> Union[Tensor, list]:
    """Fraction of samples whose ``target`` class is among the ``k`` largest
    ``logits`` (batch, classes), for each ``k`` in ``topk``: one float32
    scalar tensor, or a list for several ``k`` (MegEngine's
    ``F.topk_accuracy``).

    Example::

        >>> logits = gc.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]])
        >>> F.topk_accuracy(logits, gc.tensor([1, 1]), topk=(1, 2))[1].item()
        1.0
    """
    x = _t(logits)
    ks = _int_tuple("topk_accuracy", "topk", topk)
    if x.ndim != 2 or not all(1 <= k <= x.shape[1] for k in ks):
        raise ValueError(f"topk_accuracy: logits must be (batch, classes) and each k in [1, classes], "
                         f"got shape {x.shape} and topk={topk!r}")
    label = _int_labels(_on(target, x), "topk_accuracy", "target")
    if label.shape != x.shape[:1]:
        raise ValueError(f"topk_accuracy: target must be ({x.shape[0]},), got shape {label.shape}")
    _, pred = _topk(stop_gradient(x), builtins_max(ks), descending=True)
    hit = astype(eq(pred, astype(expand_dims(label, 1), pred.dtype)), "float32")  # noqa: F821
    accs = [sum(hit[:, :k]) / builtins_max(x.shape[0], 1) for k in ks]
    return accs[0] if len(accs) == 1 else accs


# ---- tensor and math functions MegEngine has (composites)
def argsort(inp: Tensor, descending: bool = False) -> Tensor:
    """The int32 indices that sort ``inp`` along its last axis (MegEngine's
    ``F.argsort``, for 1-d and 2-d input; any rank works here).

    Example::

        >>> F.argsort(gc.tensor([3.0, 1.0, 2.0])).numpy()
        array([1, 2, 0], dtype=int32)
    """
    return sort(inp, descending)[1]


def diag(inp: Tensor, k: int = 0) -> Tensor:
    """The ``k``-th diagonal of a 2-d ``inp`` (k > 0 above the main one), or
    the square 2-d tensor with the 1-d ``inp`` on its ``k``-th diagonal, as
    ``np.diag``.

    Example::

        >>> F.diag(gc.tensor([1, 2]), k=1).numpy()
        array([[0, 1, 0],
               [0, 0, 2],
               [0, 0, 0]], dtype=int32)
    """
    x = _t(inp)
    k = _int_arg("diag", "k", k, low=None)
    if x.ndim == 2:
        rows, cols = np.nonzero(np.eye(x.shape[0], x.shape[1], k, dtype=bool))
        return getitem(x, (rows, cols))
    if x.ndim != 1:
        raise ValueError(f"diag: inp must be 1-d or 2-d, got shape {x.shape}")
    # each cell picks an element of x, or the zero appended after them
    n = x.shape[0]
    i = np.arange(n)
    index = np.full((n + _builtins.abs(k),) * 2, n)
    index[i + builtins_max(-k, 0), i + builtins_max(k, 0)] = i
    return getitem(concat([x, zeros((1,), x.dtype, x.device)]), index)


def _pair_of(x, y) -> tuple:
    """``x`` and ``y`` as tensors (a number takes the other's dtype and
    device)."""
    if isinstance(x, Tensor) or hasattr(x, "trace"):
        return x, _t(y, x)
    y = _t(y)
    return _t(x, y), y


def _float_pair(name: str, x, y) -> tuple:
    """``x`` and ``y`` broadcast to one shape and one floating dtype."""
    x, y = _pair_of(x, y)
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise ValueError(f"{name}: shapes {x.shape} and {y.shape} do not broadcast") from None
    dtype = np.result_type(x.dtype, y.dtype)
    dtype = dtype if dtype.kind == "f" else np.dtype("float32")
    return broadcast_to(astype(x, dtype), shape), broadcast_to(astype(y, dtype), shape)


def logaddexp(x: Tensor, y: Tensor) -> Tensor:
    """Elementwise ``log(exp(x) + exp(y))``, computed without overflow (a
    logsumexp over the pair; ``x`` and ``y`` broadcast).

    Example::

        >>> F.logaddexp(gc.tensor([1000.0, -1000.0]), 1000.0).numpy()     # no overflow
        array([1000.6932, 1000.    ], dtype=float32)
    """
    x, y = _float_pair("logaddexp", x, y)
    return logsumexp(stack([x, y], 0), 0)


def atan2(y: Tensor, x: Tensor) -> Tensor:
    """Elementwise angle of the point (x, y), in [-pi, pi] (``np.arctan2``).

    Example::

        >>> F.atan2(gc.tensor([1.0, 1.0]), gc.tensor([1.0, -1.0])).numpy()
        array([0.7853982, 2.3561945], dtype=float32)
    """
    y, x = _float_pair("atan2", y, x)
    # atan of the smaller over the larger coordinate: the ratio stays in
    # [-1, 1] and its gradient, (x dy - y dx) / (x^2 + y^2), is finite
    # everywhere but the origin
    wide = ge(abs(x), abs(y))  # noqa: F821
    safe_x = where(wide & ne(x, 0), x, 1)  # noqa: F821
    safe_y = where(wide, 1, y)
    half_pi = np.asarray(np.pi / 2, x.dtype)
    # (at the origin the ratio is 0/1, constant: gradient 0 there, as torch)
    near_x = atan(where(ne(x, 0), y, 0) / safe_x) + where(lt(x, 0), where(lt(y, 0), -2 * half_pi, 2 * half_pi), 0)  # noqa: F821
    near_y = where(lt(y, 0), -half_pi, half_pi) - atan(x / safe_y)  # noqa: F821
    return where(wide, near_x, near_y)


def meshgrid(*inputs: Tensor, indexing: str = "xy") -> list:
    """Coordinate grids from 1-d tensors, as ``np.meshgrid``: each result has
    shape (N1, N2, ...) with ``indexing="ij"``; with "xy" (the default) the
    first two are swapped, (N2, N1, ...).

    Example::

        >>> xv, yv = F.meshgrid(gc.tensor([0.0, 1.0, 2.0]), gc.tensor([5.0, 6.0]))
        >>> xv.numpy()
        array([[0., 1., 2.],
               [0., 1., 2.]], dtype=float32)
    """
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    xs = [_t(v) for v in inputs]
    for i, v in enumerate(xs):
        if v.ndim != 1:
            raise ValueError(f"meshgrid: every input must be 1-d, input {i} has shape {v.shape}")
    axes = list(range(len(xs)))
    if indexing == "xy" and len(xs) >= 2:
        axes[0], axes[1] = 1, 0
    shape = [0] * len(xs)
    for v, a in zip(xs, axes):
        shape[a] = v.shape[0]
    return [broadcast_to(reshape(v, [shape[a] if j == a else 1 for j in range(len(xs))]), shape)
            for v, a in zip(xs, axes)]


def cond_take(mask: Tensor, x: Tensor) -> tuple:
    """``(values, indices)``: the elements of ``x`` where the bool ``mask``
    (of ``x``'s shape) is true, and their int32 indices into the flattened
    ``x``; both 1-d (MegEngine's ``F.cond_take``).

    Example::

        >>> v, i = F.cond_take(gc.tensor([[True, False], [False, True]]), gc.tensor([[1.0, 2.0], [3.0, 4.0]]))
        >>> v.numpy(), i.numpy()
        (array([1., 4.], dtype=float32), array([0, 3], dtype=int32))
    """
    x = _t(x)
    m = _on(mask, x)
    if not isinstance(m, Tensor):
        raise TypeError("cond_take: mask must be a concrete tensor (its values decide the result's size)")
    if m.dtype != np.bool_:
        raise TypeError(f"cond_take: mask must be a bool tensor, got {m.dtype}")
    if m.shape != x.shape:
        raise ValueError(f"cond_take: mask and x must have the same shape, got {m.shape} and {x.shape}")
    index = np.flatnonzero(m.numpy()).astype(np.int32)
    return getitem(reshape(x, (-1,)), index), Tensor(index, device=x.device)


def swapaxes(inp: Tensor, axis1: int, axis2: int) -> Tensor:
    """``inp`` with axes ``axis1`` and ``axis2`` interchanged.

    Example::

        >>> F.swapaxes(gc.tensor(np.zeros((2, 3, 4))), 0, 2).shape
        (4, 3, 2)
    """
    x = _t(inp)
    a, b = _axis_in("swapaxes", axis1, x.ndim), _axis_in("swapaxes", axis2, x.ndim)
    pattern = list(range(x.ndim))
    pattern[a], pattern[b] = b, a
    return transpose(x, pattern)


import builtins as _builtins  # noqa: E402
builtins_max = _builtins.max


class _NN:
    """``F.nn.*`` names, as in MegEngine."""


nn = _NN()
for _n in ("relu", "sigmoid", "tanh", "log_softmax", "logsoftmax", "logsumexp", "softmax", "cross_entropy",
           "linear", "indexing_one_hot", "leaky_relu", "gelu", "silu", "softplus", "logsigmoid", "conv2d", "max_pool2d", "avg_pool2d", "batch_norm",
           "dropout", "relu6", "hsigmoid", "hswish", "prelu", "one_hot", "embedding", "normalize",
           "l1_loss", "square_loss", "binary_cross_entropy", "hinge_loss"):
    setattr(nn, _n, globals()[_n])
del _n

# the composites added after the list above
for _n in ("layer_norm", "group_norm", "pad", "adaptive_avg_pool2d", "adaptive_max_pool2d", "conv1d",
           "pixel_shuffle", "topk_accuracy"):
    setattr(nn, _n, globals()[_n])
del _n


# ---- the rest of the convolution family: transposed, 3-d; resizing (F.vision)
from .ops.conv import Conv3d as _Conv3dOp, ConvTranspose2d as _ConvTranspose2dOp  # noqa: E402
from .ops.vision import INTERPOLATE_MODES as _INTERPOLATE_MODES, Interpolate as _InterpolateOp  # noqa: E402

_ConvTranspose2d, _Conv3d, _Interpolate = map(interned, (_ConvTranspose2dOp, _Conv3dOp, _InterpolateOp))


def _grouped_weight(name: str, w: Tensor, groups: int, plain_ndim: int, layout: str) -> Tensor:
    """A convolution weight in its plain form: MegEngine's grouped form
    (groups, a // groups, b // groups, *kernel), one more axis than the
    plain (a, b // groups, *kernel), is folded; ``layout`` names the plain
    form in messages."""
    if w.ndim == plain_ndim + 1:
        if w.shape[0] != groups:
            raise ValueError(f"{name}: a grouped {w.ndim}-D weight {w.shape} has {w.shape[0]} groups, "
                             f"but groups={groups}")
        return reshape(w, (w.shape[0] * w.shape[1],) + tuple(w.shape[2:]))
    if w.ndim != plain_ndim:
        raise ValueError(f"{name}: weight must be {layout} or grouped (groups, ...), got shape {w.shape}")
    return w


def conv_transpose2d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1, padding=0,
                     output_padding=0, dilation=1, groups: int = 1, conv_mode: str = "cross_correlation",
                     compute_mode: str = "default") -> Tensor:
    """2-D transposed convolution ("deconvolution") of ``inp`` (N, C_in, H, W)
    with ``weight`` (C_in, C_out // groups, KH, KW), or MegEngine's grouped
    (groups, C_in // groups, C_out // groups, KH, KW); MegEngine's
    ``F.conv_transpose2d``. The output is (N, C_out, (H - 1) * stride - 2 *
    padding + dilation * (KH - 1) + output_padding + 1, ...): the gradient of
    ``conv2d`` with respect to its input. ``output_padding`` must be smaller
    than the stride. ``bias`` broadcasts against the output, e.g. (1, C_out,
    1, 1); a (C_out,) bias is one per channel.

    Example::

        >>> x = gc.tensor(np.ones((1, 1, 2, 2), "float32"))
        >>> F.conv_transpose2d(x, gc.tensor(np.ones((1, 1, 2, 2), "float32")), stride=2).shape
        (1, 1, 4, 4)
    """
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ValueError(f"conv_transpose2d: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    x = _t(inp)
    w = _grouped_weight("conv_transpose2d", _t(weight), groups, 4, "(C_in, C_out // groups, KH, KW)")
    op = _ConvTranspose2d(_pair(stride), _pair(padding), _pair(output_padding), _pair(dilation), groups)
    out = _apply(op, x, w)[0]
    return out if bias is None else _channel_bias("conv_transpose2d", out, _t(bias, out))


def conv_transpose1d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: int = 1,
                     padding: int = 0, output_padding: int = 0, dilation: int = 1, groups: int = 1,
                     conv_mode: str = "cross_correlation", compute_mode: str = "default") -> Tensor:
    """1-D transposed convolution of ``inp`` (N, C_in, L) with ``weight``
    (C_in, C_out // groups, K) (or grouped (groups, C_in // groups, C_out //
    groups, K)): ``conv_transpose2d`` on a trailing axis of size 1. Output
    length (L - 1) * stride - 2 * padding + dilation * (K - 1) +
    output_padding + 1.

    Example::

        >>> x = gc.tensor(np.ones((1, 1, 3), "float32"))
        >>> F.nn.conv_transpose1d(x, gc.tensor([[[1.0, 2.0]]]), stride=2).numpy()
        array([[[1., 2., 1., 2., 1., 2.]]], dtype=float32)
    """
    x, w = _t(inp), _t(weight)
    if x.ndim != 3:
        raise ValueError(f"conv_transpose1d: inp must be (N, C, L), got shape {x.shape}")
    if w.ndim not in (3, 4):
        raise ValueError(f"conv_transpose1d: weight must be (C_in, C_out // groups, K) or (groups, "
                         f"C_in // groups, C_out // groups, K), got shape {w.shape}")
    s, p, op, d = (_one_int("conv_transpose1d", what, v, low) for what, v, low in
                   (("stride", stride, 1), ("padding", padding, 0), ("output_padding", output_padding, 0),
                    ("dilation", dilation, 1)))
    out = squeeze(conv_transpose2d(expand_dims(x, -1), expand_dims(w, -1), None, (s, 1), (p, 0), (op, 0),
                                   (d, 1), groups, conv_mode, compute_mode), -1)
    return out if bias is None else _channel_bias("conv_transpose1d", out, _t(bias, out))


def _triple(v):
    # as _pair: anything else goes to the op as is, which says what is wrong
    try:
        if isinstance(v, (tuple, list)):
            return tuple(_index(a) for a in v)
        v = _index(v)
        return (v, v, v)
    except TypeError:
        return tuple(v) if isinstance(v, (tuple, list)) else v


def conv3d(inp: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1, padding=0, dilation=1,
           groups: int = 1, conv_mode: str = "cross_correlation") -> Tensor:
    """3-D convolution (cross-correlation) of ``inp`` (N, C, D, H, W) with
    ``weight`` (O, C // groups, KD, KH, KW), or MegEngine's grouped (groups,
    O // groups, C // groups, KD, KH, KW); MegEngine's ``F.conv3d``.
    ``bias`` broadcasts against (N, O, OD, OH, OW), e.g. (1, O, 1, 1, 1).

    Example::

        >>> x = gc.tensor(np.ones((1, 2, 4, 4, 4), "float32"))
        >>> F.conv3d(x, gc.tensor(np.ones((3, 2, 3, 3, 3), "float32")), padding=1).shape
        (1, 3, 4, 4, 4)
    """
    if conv_mode not in ("cross_correlation", "CROSS_CORRELATION"):
        raise ValueError(f"conv3d: only conv_mode='cross_correlation' is supported, got {conv_mode!r}")
    x = _t(inp)
    w = _grouped_weight("conv3d", _t(weight), groups, 5, "(O, C // groups, KD, KH, KW)")
    out = _apply(_Conv3d(_triple(stride), _triple(padding), _triple(dilation), groups), x, w)[0]
    return out if bias is None else _channel_bias("conv3d", out, _t(bias, out))


def _resize_sizes(x: Tensor, size, scale_factor, n: int) -> tuple:
    """The output's ``n`` trailing sizes for ``interpolate``: ``size`` as
    given, or floor(input size * scale factor)."""
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor, "
                         f"got size={size!r}, scale_factor={scale_factor!r}")
    if size is not None:
        out = _int_tuple("interpolate", "size", size)
        out = out * n if len(out) == 1 else out
        if len(out) != n:
            raise ValueError(f"interpolate: size must have {n} element(s) for a {x.ndim}-D input, got {size!r}")
        return tuple(_int_arg("interpolate", "size", s, 1) for s in out)
    factors = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * n
    if len(factors) != n or not all(isinstance(f, (int, float, np.integer, np.floating)) and not isinstance(f, bool)
                                    and f > 0 for f in factors):
        raise ValueError(f"interpolate: scale_factor must be a positive number or {n} of them, got {scale_factor!r}")
    out = tuple(int(np.floor(s * float(f))) for s, f in zip(x.shape[-n:], factors))
    if min(out) < 1:
        raise ValueError(f"interpolate: scale_factor {scale_factor!r} gives an empty output {out} "
                         f"for input shape {x.shape}")
    return out


def interpolate(inp: Tensor, size=None, scale_factor=None, mode: str = "bilinear",
                align_corners: Optional[bool] = None) -> Tensor:
    """Resize ``inp`` to ``size`` or by ``scale_factor`` (output size
    floor(input size * factor)), MegEngine's ``F.vision.interpolate``:
    ``mode`` "bilinear" or "nearest" for (N, C, H, W) input, "linear" for
    (N, C, W). ``align_corners`` (linear modes only; default False) maps
    the corner pixels' centres onto each other. Source positions follow the
    output/input size ratio (PyTorch's ``recompute_scale_factor=True``).

    Example::

        >>> x = gc.tensor(np.array([[[[1.0, 2.0]]]], "float32"))
        >>> F.vision.interpolate(x, scale_factor=2, mode="nearest").numpy()
        array([[[[1., 1., 2., 2.],
                 [1., 1., 2., 2.]]]], dtype=float32)
    """
    x = _t(inp)
    mode = mode.lower() if isinstance(mode, str) else mode
    if mode == "linear":
        if x.ndim != 3:
            raise ValueError(f"interpolate: mode 'linear' needs a 3-D (N, C, W) input, got shape {x.shape}")
        (ow,) = _resize_sizes(x, size, scale_factor, 1)
        op = _Interpolate((1, ow), "bilinear", bool(align_corners))
        return squeeze(_apply(op, expand_dims(x, -2))[0], -2)
    if mode not in _INTERPOLATE_MODES:
        raise ValueError(f"interpolate: mode must be one of 'nearest', 'bilinear', 'linear', got {mode!r}")
    if x.ndim != 4:
        raise ValueError(f"interpolate: mode {mode!r} needs a 4-D (N, C, H, W) input, got shape {x.shape}")
    if align_corners and mode == "nearest":
        raise ValueError("interpolate: align_corners only applies to the linear modes, not 'nearest'")
    return _apply(_Interpolate(_resize_sizes(x, size, scale_factor, 2), mode, bool(align_corners)), x)[0]


class _Vision:
    """``F.vision.*`` names, as in MegEngine."""


vision = _Vision()
vision.interpolate = interpolate
for _n in ("conv_transpose1d", "conv_transpose2d", "conv3d", "interpolate"):
    setattr(nn, _n, globals()[_n])
del _n
