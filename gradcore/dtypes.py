"""gradcore's dtype rules, in one place (the table is in docs/core.md).

A deep-learning framework's rules, not NumPy's: the default float is
float32; an op that must produce floats from integer or bool inputs
(division, exp, log, sqrt, mean, ...) gives float32; a Python (or NumPy)
scalar takes the tensor's dtype unless it is of a higher category; two
float widths give the wider. Ops ask this module what their inputs must be
cast to (``Op.promote_inputs``, called by the core when the inputs are not
all of one floating dtype) and what they return (``Op.infer``).

Example::

    >>> promote_types("float16", "float32")
    dtype('float32')
    >>> result_type(np.zeros(3, "int32"), 1.5)
    dtype('float32')
    >>> elemwise_dtypes("float", [np.dtype("int32")])
    ((dtype('float32'),), dtype('float32'))
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple

import numpy as np

DEFAULT_FLOAT = np.dtype("float32")
DEFAULT_INT = np.dtype("int32")
BOOL = np.dtype("bool")

# category of a dtype: bool < integer < float; a higher category wins
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}
# the dtype a Python scalar of each category has when it decides the result
# (MegEngine's: Python ints are int32, floats float32)
_SCALAR_DTYPE = {0: BOOL, 1: DEFAULT_INT, 2: DEFAULT_FLOAT}


def check_dtype(dtype, where: str = "gradcore") -> np.dtype:
    """``dtype`` as a NumPy dtype if gradcore computes in it (bool, signed
    and unsigned integers, float16/32/64); complex, string, object and other
    dtypes are a TypeError naming ``where``."""
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{where}: {dtype!r} is not a dtype") from None
    if d.kind not in _CATEGORY or d.itemsize > 8:
        raise TypeError(f"{where}: dtype {d} is not supported; gradcore computes in bool, "
                        f"integers and float16/float32/float64")
    return d


def category(dtype) -> int:
    """0 for bool, 1 for integers, 2 for floats."""
    return _CATEGORY[np.dtype(dtype).kind]


@functools.lru_cache(maxsize=None)
def _promote_pair(a: np.dtype, b: np.dtype) -> np.dtype:
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca != cb:
        # the higher category wins, its dtype unchanged: float16 * mask stays float16
        return a if ca > cb else b
    res = np.promote_types(a, b)
    if res.kind != a.kind and res.kind != b.kind:
        # uint64 with a signed integer: NumPy goes to float64; no integer holds both
        raise TypeError(f"no integer dtype holds both {a} and {b}; cast one of them first")
    return res


def promote_types(*dtypes) -> np.dtype:
    """The dtype two (or more) tensors combine to: the same dtype stays; a
    higher category (bool < integer < float) wins with its own dtype; within
    a category the wider (signed with unsigned: the smallest signed integer
    holding both, uint8 with int8 gives int16).

    Example::

        >>> promote_types("int32", "float16"), promote_types("uint8", "int8")
        (dtype('float16'), dtype('int16'))
    """
    if not dtypes:
        raise ValueError("promote_types: no dtypes given")
    res = check_dtype(dtypes[0], "promote_types")
    for d in dtypes[1:]:
        d = check_dtype(d, "promote_types")
        if d is not res and d != res:
            res = _promote_pair(res, d)
    return res


def is_weak_scalar(x) -> bool:
    """Python numbers and NumPy scalars: they take the dtype of the tensors
    they meet (unless of a higher category)."""
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def _scalar_category(x) -> int:
    if isinstance(x, (bool, np.bool_)):
        return 0
    if isinstance(x, (int, np.integer)):
        return 1
    return 2


def result_type(*operands) -> np.dtype:
    """The dtype of an elementwise combination of ``operands``: tensors,
    arrays and dtypes are strong; Python and NumPy scalars are weak (a
    scalar of a higher category than every tensor gives int32 / float32 /
    bool, else it takes the tensors' dtype).

    Example::

        >>> result_type(np.zeros(2, "float16"), 2.5), result_type(np.zeros(2, "int8"), 2.5)
        (dtype('float16'), dtype('float32'))
    """
    strong, weak = [], []
    for x in operands:
        if is_weak_scalar(x):
            weak.append(_scalar_category(x))
        elif isinstance(x, (np.dtype, str, type)):
            strong.append(x)
        else:
            strong.append(x.dtype)
    res = promote_types(*strong) if strong else None
    if weak:
        top = max(weak)
        if res is None or top > category(res):
            res = _SCALAR_DTYPE[top] if res is None else promote_types(res, _SCALAR_DTYPE[top])
    if res is None:
        raise ValueError("result_type: no operands")
    return res


def scalar_dtype(tensor_dtypes: tuple, x) -> np.dtype:
    """The dtype the weak scalar ``x`` takes among tensors of ``tensor_dtypes``
    (``result_type(*tensors, x)``, cached per signature: it is on the path of
    every ``tensor * 2.0``)."""
    return _scalar_dtype(tensor_dtypes, _scalar_category(x))


@functools.lru_cache(maxsize=1024)
def _scalar_dtype(tensor_dtypes, cat):
    if not tensor_dtypes:
        return _SCALAR_DTYPE[cat]
    res = promote_types(*tensor_dtypes)
    return res if cat <= category(res) else promote_types(res, _SCALAR_DTYPE[cat])


def float_dtype(dtype) -> np.dtype:
    """The dtype an op that must produce floats computes in: a float dtype
    stays, integers and bool give float32."""
    d = np.dtype(dtype)
    return d if d.kind == "f" else DEFAULT_FLOAT


# ---------------------------------------------------------------- per op kind
# How each elementwise mode treats dtypes (ops/elemwise.py names one per row):
#   "same":    inputs promoted to one dtype, the result in it (add, mul, maximum, ...)
#   "float":   as "same", then integers and bool computed in float32 (div, exp, ...)
#   "compare": inputs promoted to one dtype, the result bool (lt, eq, ...)
#   "logical": bool inputs, bool result (logical_and, ...)
#   "select":  where(cond, a, b): cond bool, a and b promoted, the result in their dtype
ELEMWISE_RULES = ("same", "float", "compare", "logical", "select")


def elemwise_dtypes(rule: str, dtypes: Sequence[np.dtype]) -> Tuple[Tuple[np.dtype, ...], np.dtype]:
    """``(dtype each input is computed in, result dtype)`` for an elementwise
    op with the given ``rule`` (see ``ELEMWISE_RULES``)."""
    return _elemwise_dtypes(rule, tuple(np.dtype(d) for d in dtypes))


@functools.lru_cache(maxsize=4096)
def _elemwise_dtypes(rule, dtypes):
    if rule == "logical":
        return (BOOL,) * len(dtypes), BOOL
    if rule == "select":
        common = promote_types(*dtypes[1:])
        return (BOOL,) + (common,) * (len(dtypes) - 1), common
    common = promote_types(*dtypes)
    if rule == "float":
        common = float_dtype(common)
    out = BOOL if rule == "compare" else common
    return (common,) * len(dtypes), out


def reduce_dtypes(mode: str, dtype) -> Tuple[np.dtype, np.dtype]:
    """``(dtype the input is computed in, result dtype)`` of a reduction:
    mean of integers or bool in float32; sum and prod of bool in int32, of
    integers in their own dtype (MegEngine's; NumPy and PyTorch widen to
    int64); max and min keep the dtype."""
    d = np.dtype(dtype)
    if mode == "mean":
        d = float_dtype(d)
    elif mode in ("sum", "prod") and d.kind == "b":
        d = DEFAULT_INT
    return d, d


def promoted_inputs(op, in_dtypes):
    """``input_dtypes`` of ops whose inputs must share one dtype (matmul,
    conv, concat, stack: MegEngine's "naive" promotion): every input in
    ``promote_types`` of them all."""
    common = promote_types(*in_dtypes)
    return op, (common,) * len(in_dtypes)


def cast_inputs(args: Sequence, dtypes: Sequence[np.dtype], cast) -> Optional[tuple]:
    """``args`` with each one whose dtype differs from ``dtypes[i]`` replaced
    by ``cast(arg, dtype)``; None when nothing needs a cast."""
    out, changed = [], False
    for a, d in zip(args, dtypes):
        if a.dtype != d:
            a, changed = cast(a, d), True
        out.append(a)
    return tuple(out) if changed else None


# gradcore.amp's autocast mode: None while it is off, else its (low, high)
# precision dtypes. Kept here, below the ops and the functional layer, so
# that both can ask it without importing gradcore.amp (a layer above them).
_autocast: Optional[Tuple[np.dtype, np.dtype]] = None


def autocast_dtypes() -> Optional[Tuple[np.dtype, np.dtype]]:
    """``(low_prec_dtype, high_prec_dtype)`` while ``gradcore.amp``'s
    autocast mode is on, else None.

    Example::

        >>> autocast_dtypes() is None       # autocast is off
        True
    """
    return _autocast


def set_autocast_dtypes(dtypes: Optional[Tuple[np.dtype, np.dtype]]) -> None:
    """Turn autocast mode on with ``(low, high)`` dtypes, or off with None
    (``gradcore.amp`` calls this; the ops read ``autocast_dtypes``).

    Example::

        >>> set_autocast_dtypes((np.dtype("float16"), np.dtype("float32")))
        >>> autocast_dtypes()
        (dtype('float16'), dtype('float32'))
        >>> set_autocast_dtypes(None)
    """
    global _autocast
    _autocast = None if dtypes is None else (np.dtype(dtypes[0]), np.dtype(dtypes[1]))
