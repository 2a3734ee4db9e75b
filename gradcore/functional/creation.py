"""Tensors made from nothing or from a shape: zeros, ones, full, the
``*_like`` forms, arange, linspace, eye (no op: NumPy builds the data; a
``*_like`` of a tensor whose shape is known only when the graph runs, as
inside a ``vjp`` being traced, is the ZerosLike op).

Example::

    >>> F.full((2,), 7).numpy()
    array([7, 7], dtype=int32)
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from .._core import Tensor, apply as _apply, wrap_array
from ..ops.shape import ZerosLike
from ..devices import filled, norm_device
from ._args import _fill_value, _host, _int_or_err, _ints, _t
from ..op import ArgumentError


def _owning(arr: np.ndarray, device) -> Tensor:
    """A Tensor of ``arr``, an array made here for it: on the cpu it takes
    the array itself (``Tensor(arr)`` would copy it, as a caller's array
    must be; twice the memory and time for nothing here)."""
    device = norm_device(device)
    if device == "cpu" and arr.dtype.kind in "biuf" and arr.dtype.itemsize <= 8:
        return wrap_array(arr, device)
    return Tensor(arr, device=device)       # to the device; or the dtype's refusal


def _filled(name: str, shape, value, dtype, device) -> Tensor:
    """A tensor of ``shape`` filled with ``value`` on ``device``, made there
    (no host array for cuda); bad shapes, dtypes and values raise as NumPy's
    constructors do, naming ``name``."""
    device = norm_device(device)
    if device == "cpu":
        return _owning(_host(name, lambda: np.full(shape, value, dtype), shape=shape, value=value, dtype=dtype),
                       device)
    # the checks NumPy's constructor makes, on a zero-stride view (no memory)
    spec = _host(name, lambda: np.broadcast_to(np.asarray(value, dtype), shape), shape=shape, value=value,
                 dtype=dtype)
    return wrap_array(filled(spec.shape, spec.dtype.type(value), spec.dtype, device), device)


def zeros(shape: Union[int, Sequence[int]], *, dtype: Union[str, np.dtype] = "float32",
          device: Optional[str] = None) -> Tensor:
    """A tensor of ``shape`` filled with 0 (float32 unless ``dtype`` says otherwise).

    Example::

        >>> F.zeros((2, 3)).shape
        (2, 3)
        >>> F.zeros(2, dtype="int32").numpy()
        array([0, 0], dtype=int32)
    """
    return _filled("zeros", shape, 0, dtype, device)


def ones(shape: Union[int, Sequence[int]], *, dtype: Union[str, np.dtype] = "float32",
         device: Optional[str] = None) -> Tensor:
    """A tensor of ``shape`` filled with 1 (float32 unless ``dtype`` says otherwise).

    Example::

        >>> F.ones((2, 2)).numpy()
        array([[1., 1.],
               [1., 1.]], dtype=float32)
    """
    return _filled("ones", shape, 1, dtype, device)


def full(shape: Union[int, Sequence[int]], value: Union[int, float, bool, Tensor], *,
         dtype: Optional[Union[str, np.dtype]] = None, device: Optional[str] = None) -> Tensor:
    """A tensor of ``shape`` filled with ``value``. Without ``dtype`` it comes
    from the value as in MegEngine: bool, int32 for an int, float32 for a float.

    Example::

        >>> F.full((2,), 7).numpy()
        array([7, 7], dtype=int32)
        >>> F.full((2,), 0.5).numpy()
        array([0.5, 0.5], dtype=float32)
    """
    if dtype is None:
        dtype = _t(value, name="full").dtype
    _host("full", lambda: _fill_value("full", value, dtype), dtype=dtype)   # (dtype may be unknown)
    return _filled("full", shape, value, dtype, device)


def _filled_like(name: str, x, value) -> Tensor:
    if x.shape is None:
        # a traced tensor (a vjp, a decomposition): its shape is known when the graph runs
        zeros = _apply(ZerosLike(), x)[0]
        return zeros if value == 0 else zeros + value
    return _filled(name, x.shape, value, x.dtype, x.device)


def zeros_like(inp: Tensor) -> Tensor:
    """Zeros of ``inp``'s shape, dtype and device (also of a tensor traced
    in a ``vjp``: ``F.zeros_like(x) + F.expand_dims(g, -1)`` gives a
    reduction's gradient back x's shape).

    Example::

        >>> F.zeros_like(gc.tensor([1.0, 2.0])).numpy()
        array([0., 0.], dtype=float32)
    """
    return _filled_like("zeros_like", _t(inp, name="zeros_like"), 0)


def ones_like(inp: Tensor) -> Tensor:
    """Ones of ``inp``'s shape, dtype and device.

    Example::

        >>> F.ones_like(gc.tensor([1, 2])).numpy()
        array([1, 1], dtype=int32)
    """
    return _filled_like("ones_like", _t(inp, name="ones_like"), 1)


def full_like(inp: Tensor, value: Union[int, float]) -> Tensor:
    """A tensor of ``inp``'s shape, dtype and device filled with ``value``.

    Example::

        >>> F.full_like(gc.tensor([[1, 2], [3, 4]]), 7).numpy()
        array([[7, 7],
               [7, 7]], dtype=int32)
    """
    x = _t(inp)
    _fill_value("full_like", value, x.dtype)
    return _filled_like("full_like", x, value)


def arange(start: float = 0, stop: Optional[float] = None, step: float = 1, *,
           dtype: Union[str, np.dtype] = "float32", device: Optional[str] = None) -> Tensor:
    """Evenly spaced values in [start, stop) ``step`` apart, NumPy's ``arange``;
    one argument is ``stop``. float32 by default, as MegEngine's.

    Example::

        >>> F.arange(4).numpy()
        array([0., 1., 2., 3.], dtype=float32)
        >>> F.arange(1, 2, 0.25).numpy()
        array([1.  , 1.25, 1.5 , 1.75], dtype=float32)
    """
    if step == 0:
        raise ArgumentError("arange: step must not be 0")
    if stop is None:
        start, stop = 0, start
    if stop is None:
        # np.arange(0, None) is an empty array: not what arange(None) meant
        raise TypeError("arange: stop must be a number, got None")
    return _owning(_host("arange", lambda: np.arange(start, stop, step, dtype=dtype),
                         start=start, stop=stop, step=step, dtype=dtype), device)


def linspace(start: float, stop: float, num: int, *, dtype: Union[str, np.dtype] = "float32",
             device: Optional[str] = None) -> Tensor:
    """``num`` evenly spaced values from ``start`` to ``stop``, both included.

    Example::

        >>> F.linspace(0, 1, 5).numpy()
        array([0.  , 0.25, 0.5 , 0.75, 1.  ], dtype=float32)
    """
    num = _int_or_err("linspace", "num", num)
    if num < 0:
        raise ArgumentError(f"linspace: num must be >= 0, got {num}")
    return _owning(_host("linspace", lambda: np.linspace(start, stop, num, dtype=dtype),
                         start=start, stop=stop, num=num, dtype=dtype), device)


def eye(N: Union[int, Sequence[int], Tensor], M: Optional[int] = None, *,
        dtype: Union[str, np.dtype] = "float32", device: Optional[str] = None) -> Tensor:
    """An (N, M) matrix (M defaults to N) with ones on the diagonal. As in
    MegEngine, ``N`` may also be the shape: ``(N,)``, ``(N, M)`` or a 1-d
    integer Tensor holding it (``F.eye(x.shape)``).

    Example::

        >>> F.eye(2, 3).numpy()
        array([[1., 0., 0.],
               [0., 1., 0.]], dtype=float32)
    """
    if M is None and not isinstance(N, (int, np.integer, float, np.floating)):
        if N is None:
            raise TypeError("eye: N must be an int or a shape, got None")
        shape = _ints("eye", "shape", np.asarray(N.numpy() if isinstance(N, Tensor) else N).reshape(-1).tolist())
        if len(shape) not in (1, 2):
            raise ArgumentError(f"eye: a shape must have 1 or 2 elements, got {N!r}")
        N, M = shape[0], shape[-1]
    N, M = _int_or_err("eye", "N", N), None if M is None else _int_or_err("eye", "M", M)
    if N < 0 or (M is not None and M < 0):
        raise ArgumentError(f"eye: N and M must be >= 0, got N={N}, M={M}")
    return _owning(_host("eye", lambda: np.eye(N, M, dtype=dtype), N=N, M=M, dtype=dtype), device)
