"""Elementwise functions written by hand: ``where`` (it checks its mask),
``clip``, predicates and activations composed of the table's ops, and
MegEngine's names for the comparisons. The functions of the table itself
(``F.exp``, ``F.add``, ...) are generated: elemwise_table.py.

Example::

    >>> F.clip(gc.tensor([-1.0, 0.5, 2.0]), 0.0, 1.0).numpy()
    array([0. , 0.5, 1. ], dtype=float32)
"""
from __future__ import annotations

import numpy as np

from .._core import Tensor, apply1 as _apply1
from ..op import OpError
from ..ops.elemwise import Elemwise
from ._args import _named, _t
from .elemwise_table import abs, atan, eq, expm1, ge, gt, le, lt, ne, sign
from .shape import astype, broadcast_to
from ..op import ArgumentError

_BOOL = np.dtype(bool)
_OP_WHERE = Elemwise("where")


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
    """Elementwise angle of the point (x, y), in [-pi, pi] (``np.arctan2``).

    Example::

        >>> F.atan2(gc.tensor([1.0, 1.0]), gc.tensor([1.0, -1.0])).numpy()
        array([0.7853982, 2.3561945], dtype=float32)
    """
    y, x = _float_pair("atan2", y, x)
    # both infinite: the direction of (sign x, sign y), as NumPy's and torch's
    both = eq(abs(x), np.inf) & eq(abs(y), np.inf)
    x, y = where(both, sign(x), x), where(both, sign(y), y)
    # atan of the smaller over the larger coordinate: the ratio stays in
    # [-1, 1] and its gradient, (x dy - y dx) / (x^2 + y^2), is finite
    # everywhere but the origin
    wide = ge(abs(x), abs(y))
    safe_x = where(wide & ne(x, 0), x, 1)
    safe_y = where(wide, 1, y)
    def const(v):       # a 0-d array of x's dtype (a NumPy scalar would be weak: float32)
        return np.asarray(v, x.dtype)
    # (at the origin the ratio is 0/1, constant: gradient 0 there, as torch)
    near_x = atan(where(ne(x, 0), y, 0) / safe_x) + where(lt(x, 0), where(lt(y, 0), const(-np.pi), const(np.pi)), 0)
    near_y = where(lt(y, 0), const(-np.pi / 2), const(np.pi / 2)) - atan(x / safe_y)
    return where(wide, near_x, near_y)


# ---- activations composed of the table's ops (F.nn has them too)
def leaky_relu(inp, negative_slope: float = 0.01):
    """``x`` where positive, ``negative_slope * x`` elsewhere."""
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
