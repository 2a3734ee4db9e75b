"""Argument checks and conversions shared by the modules of
gradcore.functional: turning arguments into tensors, reading ints and axes,
and naming the function in an error."""
from __future__ import annotations

import builtins
import operator
import sys
from typing import Optional

import numpy as np

from .._core import Tensor
# ``v`` as an int, or a TypeError naming the function: the ops' own reading of an int
from ..ops.reduce import op_int as _int_or_err
from ..op import ArgumentError

_index = operator.index
builtins_max = builtins.max     # the modules shadow max (F.max) and want Python's too
_PACKAGE = __name__.rpartition(".")[0]      # "gradcore.functional"


def _axis_key(axis):
    return tuple(axis) if isinstance(axis, list) else axis


def _passes(x) -> bool:
    """Whether ``x`` goes to the op as it is: a Tensor, a symbolic tensor
    inside a trace, or a NumPy array of numbers (which has a ``trace``
    method too; the op converts it, keeping its dtype, or refuses it: a str
    or object index is the op's IndexError). A complex array does not
    (functions read its dtype first): Tensor() refuses it here, naming the
    function."""
    if isinstance(x, Tensor):
        return True
    if isinstance(x, np.ndarray):
        return x.dtype.kind != "c"
    return hasattr(x, "trace")


def _on(x, like) -> Tensor:
    """``x`` as a Tensor on ``like``'s device, with its own dtype (index
    arrays, labels)."""
    if _passes(x):
        return x
    return _new_tensor(x, None, getattr(like, "device", None), None)


def _t(x, like: Optional[Tensor] = None, name: Optional[str] = None) -> Tensor:
    if _passes(x):
        return x
    return _new_tensor(x, None if like is None else like.dtype, None if like is None else like.device, name)


def _ours(frame) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name == _PACKAGE or name.startswith(_PACKAGE + ".")


def _caller() -> str:
    """The public function of gradcore.functional that is running (for
    messages): the innermost caller in this package whose name does not
    start with an underscore."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_name.startswith(("_", "<")) and _ours(f):
        f = f.f_back
    return f.f_code.co_name if f is not None and _ours(f) else "functional"


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
        return type(exc)(f"{name}: {text}")
    except Exception:
        return exc


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


def _int_arg(name: str, what: str, v, low: Optional[int] = 0) -> int:
    """``v`` as an int no smaller than ``low`` (None: any), or a clear error
    naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: {what} must be an int, got {type(v).__name__} {v!r}")
    if low is not None and v < low:
        raise ArgumentError(f"{name}: {what} must be >= {low}, got {v}")
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
        raise ArgumentError(f"{name}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


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


def _fill_value(name: str, value, dtype) -> None:
    """None, or NaN/inf into an integer or bool dtype (NumPy would write
    garbage such as INT_MIN), is an error naming ``name``."""
    if value is None:
        raise TypeError(f"{name}: value is None; give a number")
    if isinstance(value, (float, np.floating)) and not np.isfinite(value) and np.dtype(dtype).kind in "biu":
        raise ArgumentError(f"{name}: cannot fill a {np.dtype(dtype)} tensor with {value}")


def _check_compute_mode(name: str, compute_mode) -> None:
    """MegEngine's two compute modes (both compute in the inputs' dtype
    here); anything else is a typo, not a silent default."""
    if compute_mode not in ("default", "float32", "DEFAULT", "FLOAT32"):
        raise ArgumentError(f"{name}: compute_mode must be 'default' or 'float32', got {compute_mode!r}")
