"""Elementwise functions written by hand: ``where`` (it checks its mask),
``clip``, predicates and activations composed of the table's ops, logaddexp,
and MegEngine's names for the comparisons. The functions of the table itself
(``F.exp``, ``F.add``, ...) are generated: elemwise_table.py; this module
re-exports them, so that ``F.elemwise`` holds every name of MegEngine's
``functional.elemwise`` (``F.elemwise.add`` is ``F.add``).

Example::

    >>> F.clip(gc.tensor([-1.0, 0.5, 2.0]), 0.0, 1.0).numpy()
    array([0. , 0.5, 1. ], dtype=float32)
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np

from .._core import Tensor, apply1 as _apply1
from ..op import OpError
from ..ops.elemwise import Elemwise
from ._args import _named, _t
from .elemwise_table import abs, eq, expm1, floor_div, ge, gt, le, lt, ne
# re-exported (MegEngine's functional.elemwise names): the generated table functions
from .elemwise_table import (acos, acosh, add, asin, asinh, atan, atanh, ceil, cos, cosh, div, erf,  # noqa: F401
                             exp, floor, log, log1p, maximum, logical_and, logical_not, logical_or, logical_xor,
                             minimum, mod, mul, neg, pow, round, sin, sinh, softplus, sqrt, square, sub, tan,
                             tanh)
from .shape import astype, broadcast_to
from ..dtypes import promote_types
from ..op import ArgumentError

_BOOL = np.dtype(bool)
_OP_WHERE = Elemwise("where")
_OP_ATAN2 = Elemwise("atan2")


def where(mask: Tensor, x: Tensor = None, y: Tensor = None) -> Tensor:
    """``x`` where ``mask`` is true, else ``y``; ``mask`` is a bool tensor
    (as MegEngine: a float or int mask is an error, not a truthiness test).
    ``F.where(mask)`` alone is ``F.non_zero(mask, as_tuple=True)``.

    Example::

        >>> x = gc.tensor([-1.0, 2.0])
        >>> F.where(x > 0, x, 0.0).numpy()
        array([0., 2.], dtype=float32)
    """
    if x is None and y is None:
        from .indexing import non_zero
        return non_zero(mask, as_tuple=True)
    if isinstance(mask, (Tensor, np.ndarray)) and mask.dtype is not _BOOL and mask.dtype != _BOOL:
        raise TypeError(f"where: mask must be a bool tensor, got {mask.dtype} of shape {mask.shape} "
                        f"(compare first, e.g. F.where(x > 0, x, y))")
    return _apply1(_OP_WHERE, mask, x, y)


def clip(x: Tensor, lower: Optional[Union[float, Tensor]] = None,
         upper: Optional[Union[float, Tensor]] = None) -> Tensor:
    """Limit ``x`` to [lower, upper] (either may be None). The gradient
    passes where ``lower <= x <= upper``, bounds included (PyTorch's
    ``clamp``); a bound given as a tensor gets it where ``x`` is beyond it.

    Example::

        >>> F.clip(gc.tensor([-1.0, 0.5, 2.0]), 0.0, 1.0).numpy()
        array([0. , 0.5, 1. ], dtype=float32)
    """
    x = _t(x)
    try:
        if lower is not None:
            x = where(lt(x, lower), lower, x)
        if upper is not None:
            x = where(gt(x, upper), upper, x)
    except (OpError, TypeError) as exc:     # a bound of the wrong shape or type
        raise _named("clip", exc) from exc
    return x


def isnan(inp: Tensor) -> Tensor:
    """True where ``inp`` is NaN (a bool tensor; never for integers).

    Example::

        >>> F.isnan(gc.tensor([1.0, float("nan")])).numpy()
        array([False,  True])
    """
    x = _t(inp)
    return ne(x, x)


def isinf(inp: Tensor) -> Tensor:
    """True where ``inp`` is +inf or -inf (a bool tensor).

    Example::

        >>> F.isinf(gc.tensor([1.0, -float("inf")])).numpy()
        array([False,  True])
    """
    return eq(abs(_t(inp)), float("inf"))


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
        raise ArgumentError(f"{name}: shapes {x.shape} and {y.shape} do not broadcast") from None
    dtype = np.result_type(x.dtype, y.dtype)
    dtype = dtype if dtype.kind == "f" else np.dtype("float32")
    return broadcast_to(astype(x, dtype), shape), broadcast_to(astype(y, dtype), shape)


def atan2(y: Tensor, x: Tensor) -> Tensor:
    """Elementwise angle of the point (x, y), in [-pi, pi], as ``np.arctan2``
    (the sign of a zero counts: ``atan2(0, -0.0)`` is pi). The
    ``Elemwise("atan2")`` op: kernels and gradient in ops/elemwise.py.

    Example::

        >>> F.atan2(gc.tensor([1.0, 1.0]), gc.tensor([1.0, -1.0])).numpy().astype(float).round(4).tolist()
        [0.7854, 2.3562]
    """
    return _apply1(_OP_ATAN2, y, x)


# ---- activations composed of the table's ops (F.nn has them too)
def logaddexp(x: Tensor, y: Tensor) -> Tensor:
    """Elementwise ``log(exp(x) + exp(y))``, computed without overflow (a
    logsumexp over the pair; ``x`` and ``y`` broadcast).

    Example::

        >>> F.logaddexp(gc.tensor([1000.0, -1000.0]), 1000.0).numpy()     # no overflow
        array([1000.6932, 1000.    ], dtype=float32)
    """
    x, y = _float_pair("logaddexp", x, y)
    # the larger plus softplus(smaller - larger): smooth in both inputs, so every
    # order of derivative is right at ties too (max + log1p(exp(-|x - y|)) is not:
    # its kinks cancel only in the first order). An infinite input has gradient 1
    # (its partner 0); two equal infinities give x + log 2, with no inf - inf.
    first = x >= y
    hi, lo = where(first, x, y), where(first, y, x)
    both_inf = eq(x, y) & isinf(x)
    return hi + softplus(where(both_inf, 0.0, lo) - where(both_inf, 0.0, hi))


def _shift_pair(name: str, x, y) -> tuple:
    """``x`` and ``y`` as tensors of one integer dtype, and its bit width
    (MegEngine's shifts take integers; a count must be >= 0: checked on the
    cpu, where the counts are at hand)."""
    x, y = _pair_of(x, y)
    if x.dtype.kind not in "iu" or y.dtype.kind not in "iu":
        raise TypeError(f"{name}: x and y must be integer tensors, got {x.dtype} and {y.dtype} "
                        f"(shapes {x.shape} and {y.shape})")
    dtype = promote_types(x.dtype, y.dtype)
    x, y = astype(x, dtype), astype(y, dtype)
    if y.device == "cpu" and y.size and y.numpy().min() < 0:
        raise ArgumentError(f"{name}: shift counts must be >= 0, got {y.numpy().min()} "
                            f"(shapes {x.shape} and {y.shape})")
    return x, y, dtype.itemsize * 8


def _powers_of_two(dtype: np.dtype, n: int, count: Tensor) -> Tensor:
    """``2 ** count`` in ``dtype``, for counts clipped to [0, n): a lookup in
    a table of the n powers (2 ** (bits - 1) of a signed dtype wraps to its
    minimum, as ``1 << (bits - 1)`` does)."""
    table = Tensor((np.uint64(1) << np.arange(n, dtype=np.uint64)).astype(dtype), device=count.device)
    return table[astype(clip(count, 0, n - 1), "int32")]


def left_shift(x: Tensor, y: Tensor) -> Tensor:
    """Elementwise ``x << y`` of integer tensors (they broadcast; the result
    has their promoted dtype), MegEngine's ``F.left_shift``: the bits of
    ``x`` move ``y`` places up, those past the top are lost (as in C; a
    count of the bit width or more leaves 0, as NumPy's). Also ``x << y``.

    Example::

        >>> F.left_shift(gc.tensor([1, 2, -3]), 2).numpy()
        array([  4,   8, -12], dtype=int32)
    """
    x, y, bits = _shift_pair("left_shift", x, y)
    # x * 2**y wraps exactly as the shift does
    return astype(where(lt(y, bits), x * _powers_of_two(x.dtype, bits, y), 0), x.dtype)


def right_shift(x: Tensor, y: Tensor) -> Tensor:
    """Elementwise ``x >> y`` of integer tensors (they broadcast; the result
    has their promoted dtype), MegEngine's ``F.right_shift``: arithmetic
    for signed dtypes (the sign fills in from the top: ``-5 >> 1`` is -3),
    logical for unsigned; a count of the bit width or more leaves -1 for a
    negative ``x``, else 0 (NumPy's). Also ``x >> y``.

    Example::

        >>> F.right_shift(gc.tensor([8, 7, -5]), 1).numpy()
        array([ 4,  3, -3], dtype=int32)
    """
    x, y, bits = _shift_pair("right_shift", x, y)
    signed = x.dtype.kind == "i"
    # below this count the shift is a floor division by a positive power of two
    top = bits - 1 if signed else bits
    shifted = floor_div(x, _powers_of_two(x.dtype, top, y))
    # beyond it every bit but the sign's is shifted out
    rest = where(lt(x, 0), -1, 0) if signed else 0
    return astype(where(lt(y, top), shifted, rest), x.dtype)


def leaky_relu(inp: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` where positive, ``negative_slope * x`` elsewhere.

    Example::

        >>> F.leaky_relu(gc.tensor([-2.0, 3.0]), negative_slope=0.1).numpy()
        array([-0.2,  3. ], dtype=float32)
    """
    x = _t(inp)
    try:
        return where(gt(x, 0), x, x * negative_slope)
    except (OpError, TypeError) as exc:       # a slope that is no number
        raise _named("leaky_relu", exc) from exc


def relu6(x: Tensor) -> Tensor:
    """``min(max(x, 0), 6)``.

    Example::

        >>> F.relu6(gc.tensor([-1.0, 3.0, 8.0])).numpy()
        array([0., 3., 6.], dtype=float32)
    """
    # not clip(x, 0, 6): PyTorch's relu6 has gradient 0 at both kinks
    x = _t(x)
    # 0.0: no -0.0 below zero, no NaN at -inf; NaN stays NaN (it is neither <= 0
    # nor >= 6), as in PyTorch and in relu, clip and maximum
    return where(ge(x, 6), 6, where(le(x, 0), 0.0, x))


def hsigmoid(x: Tensor) -> Tensor:
    """Hard sigmoid, ``relu6(x + 3) / 6``.

    Example::

        >>> F.hsigmoid(gc.tensor([-4.0, 0.0, 4.0])).numpy()
        array([0. , 0.5, 1. ], dtype=float32)
    """
    return relu6(_t(x) + 3) / 6


def hswish(x: Tensor) -> Tensor:
    """Hard swish, ``x * relu6(x + 3) / 6``.

    Example::

        >>> F.hswish(gc.tensor([0.0, 1.0, 4.0])).numpy()
        array([0.       , 0.6666667, 4.       ], dtype=float32)
    """
    x = _t(x)
    # below -3 it is 0; computed on a finite stand-in there, or -inf * 0
    # would make the value (and the gradient through where) NaN
    low = lt(x, -3)
    safe = where(low, 0.0, x)
    return where(low, 0.0, safe * hsigmoid(safe))


def elu(inp: Tensor, alpha: float = 1.0) -> Tensor:
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere (exp never
    sees a positive argument, so large inputs neither overflow nor poison
    the gradient).

    Example::

        >>> F.elu(gc.tensor([-1.0, 2.0])).numpy()
        array([-0.63212055,  2.        ], dtype=float32)
    """
    x = _t(inp)
    positive = gt(x, 0)
    # at 0 the gradient is alpha, torch's (minimum's tie would split it)
    try:
        return where(positive, x, expm1(where(positive, 0, x)) * alpha)
    except (OpError, TypeError) as exc:       # an alpha that is no number
        raise _named("elu", exc) from exc


def prelu(x: Tensor, y: Tensor) -> Tensor:
    """``max(x, 0) + y * min(x, 0)``, MegEngine's ``F.nn.prelu(x, y)``: the
    slope ``y`` broadcasts against ``x`` (for one slope per channel of
    (N, C, H, W), give it shape (1, C, 1, 1) or (C, 1, 1)).

    Example::

        >>> F.prelu(gc.tensor([-2.0, 3.0]), gc.tensor([0.25])).numpy()
        array([-0.5,  3. ], dtype=float32)
    """
    x = _t(x)
    # at 0 the gradient is y, torch's (minimum's tie would split it)
    try:
        return where(gt(x, 0), x, x * _t(y, x))
    except OpError as exc:        # a slope that does not broadcast against x
        raise _named("prelu", exc) from exc


# ---- MegEngine's names for the comparison rows
equal = eq
not_equal = ne
less = lt
less_equal = le
greater = gt
greater_equal = ge
