"""Reductions (sum, mean, max, min, prod, argmax, argmin, cumsum) and the
statistics composed of them (var, std, norm). Their ops: ops/reduce.py.

Example::

    >>> F.sum(gc.tensor([[1.0, 2.0], [3.0, 4.0]]), axis=1).numpy()
    array([3., 7.], dtype=float32)
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from .._core import Tensor, apply as _apply, apply1 as _apply1
from ..op import OpError
from ..ops.reduce import ArgReduce, CumSum, Reduce
from ._args import _axis_in, _axis_key, _int_or_err, _named, _t
from .elemwise import where
from .elemwise_table import abs, eq, ne, sqrt
from .shape import astype

_Reduce = Reduce      # F._Reduce: gradcore.tensor_methods builds its reductions with it
# the commonest reductions (a loss's ``F.sum(x)``, ``F.mean(x)``): one call
# into the core, no op lookup, no helper frame
_SUM_ALL, _MEAN_ALL = Reduce("sum", None, False), Reduce("mean", None, False)


class AxisError(OpError, AssertionError):
    """An axis given twice: an ``OpError`` (a ValueError) here, and the
    AssertionError MegEngine raises for it."""


def _reduce_input(mode: str, inp, axis) -> Tensor:
    """``inp`` as a tensor for the reduction ``mode``; an axis named twice
    is an AxisError. (Each reduction calls the op itself: one Python frame
    fewer per call than a shared helper doing all of it.)"""
    x = inp if isinstance(inp, Tensor) else _t(inp, name=mode)
    if isinstance(axis, (tuple, list)) and x.shape is not None and x.ndim:
        seen = [_int_or_err(mode, "axis", a) % x.ndim for a in axis]
        if len(set(seen)) != len(seen):
            raise AxisError(f"{mode}: axis {tuple(axis)} names an axis twice (input shape {x.shape})")
    return x


def sum(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis``: an int, a sequence of axes, or None (every axis).

    Example::

        >>> F.sum(gc.tensor([[1.0, 2.0], [3.0, 4.0]]), axis=1).numpy()
        array([3., 7.], dtype=float32)
    """
    if axis is None and keepdims is False and isinstance(inp, Tensor):
        return _apply1(_SUM_ALL, inp)
    x = _reduce_input("sum", inp, axis)
    return _apply(Reduce("sum", _axis_key(axis), bool(keepdims)), x)[0]


def mean(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis``: an int, a sequence of axes, or None (every axis).

    Example::

        >>> F.mean(gc.tensor([[1.0, 2.0], [3.0, 4.0]]), axis=1).numpy()
        array([1.5, 3.5], dtype=float32)
    """
    if axis is None and keepdims is False and isinstance(inp, Tensor):
        return _apply1(_MEAN_ALL, inp)
    x = _reduce_input("mean", inp, axis)
    return _apply(Reduce("mean", _axis_key(axis), bool(keepdims)), x)[0]


def max(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Largest element over ``axis``: an int, a sequence of axes, or None (every axis).

    Example::

        >>> F.max(gc.tensor([[1.0, 2.0], [3.0, 4.0]]), axis=1).numpy()
        array([2., 4.], dtype=float32)
    """
    x = _reduce_input("max", inp, axis)
    return _apply(Reduce("max", _axis_key(axis), bool(keepdims)), x)[0]


def min(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Smallest element over ``axis``: an int, a sequence of axes, or None (every axis).

    Example::

        >>> F.min(gc.tensor([[1.0, 2.0], [3.0, 4.0]]), axis=1).numpy()
        array([1., 3.], dtype=float32)
    """
    x = _reduce_input("min", inp, axis)
    return _apply(Reduce("min", _axis_key(axis), bool(keepdims)), x)[0]


def prod(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Product over ``axis``: an int, a sequence of axes, or None (every axis).

    Example::

        >>> F.prod(gc.tensor([[1.0, 2.0], [3.0, 4.0]]), axis=1).numpy()
        array([ 2., 12.], dtype=float32)
    """
    x = _reduce_input("prod", inp, axis)
    return _apply(Reduce("prod", _axis_key(axis), bool(keepdims)), x)[0]


def _arg_reduce(mode, inp, axis, keepdims):
    x = _t(inp)
    if not isinstance(axis, (tuple, list)):
        return _apply(ArgReduce(mode, axis, bool(keepdims)), x)[0]
    # MegEngine's rule for several axes: one arg-reduction per axis, the
    # last axis first, each applied to the previous result
    axes = sorted({_axis_in(mode, a, x.ndim) for a in axis}, reverse=True)
    if len(axes) != len(axis):
        raise AxisError(f"{mode}: axis {tuple(axis)} names an axis twice (input shape {x.shape})")
    for a in axes:
        x = _apply(ArgReduce(mode, a, bool(keepdims)), x)[0]
    return x


def argmax(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Index of the largest element along ``axis`` (None: flattened), int32.
    For a sequence of axes, as MegEngine: argmax over each in turn, the
    last axis first (each step on the previous step's indices).

    Example::

        >>> x = gc.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
        >>> F.argmax(x, axis=1).numpy()
        array([1, 0], dtype=int32)
        >>> F.argmax(x).item()     # of the flattened tensor
        3
    """
    return _arg_reduce("argmax", inp, axis, keepdims)


def argmin(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Index of the smallest element along ``axis`` (None: flattened), int32;
    a sequence of axes as in ``argmax``.

    Example::

        >>> F.argmin(gc.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]]), axis=0).numpy()
        array([0, 1, 0], dtype=int32)
    """
    return _arg_reduce("argmin", inp, axis, keepdims)


def cumsum(inp: Tensor, axis: int = 0) -> Tensor:
    """Cumulative sum along ``axis``.

    Example::

        >>> F.cumsum(gc.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), axis=1).numpy()
        array([[ 1.,  3.,  6.],
               [ 4.,  9., 15.]], dtype=float32)
    """
    return _apply(CumSum(axis, False), _t(inp))[0]


# ---- statistics (composites: their gradients come from the recorded ops they are made of)
def var(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Population variance over ``axis`` (MegEngine's ``F.var``).

    Example::

        >>> F.var(gc.tensor([[1.0, 3.0], [2.0, 2.0]]), axis=1).numpy()
        array([1., 0.], dtype=float32)
    """
    x = _t(inp)
    try:
        m = mean(x, axis, True)
    except (OpError, TypeError) as exc:       # an axis out of range or not an int
        raise _named("var", exc) from exc
    d = x - m
    return mean(d * d, axis, keepdims)


def std(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = False) -> Tensor:
    """Population standard deviation over ``axis``. Where it is 0 (constant
    data) the gradient is 0, as PyTorch's, not 0 * inf.

    Example::

        >>> F.std(gc.tensor([[1.0, 3.0], [2.0, 2.0]]), axis=1).numpy()
        array([1., 0.], dtype=float32)
    """
    try:
        v = var(inp, axis, keepdims)
    except (OpError, TypeError) as exc:
        raise _named("std", exc) from exc
    return _sqrt_zero_grad(v)


def _sqrt_zero_grad(v):
    """sqrt(v) whose gradient where v is 0 is 0 (PyTorch's subgradient), not inf."""
    zero = eq(v, 0)
    return where(zero, 0, sqrt(where(zero, 1, v)))


def norm(inp: Tensor, ord: Optional[float] = None, axis: Optional[Union[int, Sequence[int]]] = None,
         keepdims: bool = False) -> Tensor:
    """Vector p-norm over ``axis`` (all elements when None); ``ord`` None is 2.

    Example::

        >>> F.norm(gc.tensor([[3.0, 4.0], [6.0, 8.0]]), ord=2, axis=-1).numpy()
        array([ 5., 10.], dtype=float32)
        >>> F.norm(gc.tensor([3.0, -4.0]), ord=1).item()
        7.0
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
        return _sqrt_zero_grad(sum(x * x, axis, keepdims))
    if ord == 1:
        return sum(abs(x), axis, keepdims)
    if ord == float("inf"):
        return max(abs(x), axis, keepdims)
    if ord == -float("inf"):
        return min(abs(x), axis, keepdims)
    if ord == 0:
        return sum(astype(ne(x, 0), x.dtype), axis, keepdims)
    # a zero element adds nothing (its power's slope, inf for ord < 1, would
    # meet abs's 0 as NaN): it is selected out; with ord < 0 it makes the norm
    # 0 (its power is inf). As for ord 2, a norm of 0 has gradient 0 (PyTorch's)
    a = abs(x)
    hit = eq(a, 0)
    s = sum(where(hit, 0, where(hit, 1, a) ** ord), axis, keepdims)
    zero = eq(s, 0)
    if ord < 0:
        zero = zero | (sum(astype(hit, x.dtype), axis, keepdims) > 0)
    return where(zero, 0, where(zero, 1, s) ** (1.0 / ord))
