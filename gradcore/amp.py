"""Automatic mixed precision, MegEngine's ``megengine.amp``: ``autocast``
(a context manager and decorator) and ``GradScaler``.

In autocast mode the matrix products and the 1-d/2-d convolutions
(``F.matmul``, ``F.linear``, ``F.conv1d``, ``F.conv2d``,
``F.conv_transpose2d``, their modules) cast their inputs to
``low_prec_dtype`` (float16) and give float16; the elementwise ops that
lose most in float16 (``/``, ``**``, exp, log, sqrt, the trigonometric and
hyperbolic functions, softplus, logsigmoid), softmax, log_softmax,
logsumexp and cross_entropy cast theirs to ``high_prec_dtype`` (float32), as layer and group
normalisation do; batch
normalisation takes its input in float16 and its parameters in float32 and
gives float16. Everything else keeps its inputs' dtypes (float16 with
float32 gives float32). The casts are recorded, so float32 parameters get
float32 gradients. float16 kernels exist on the CPU only: on cuda a cast
op's float16 input is refused with a clear error.

The mode is global (MegEngine's is too): ``gradcore.amp.enabled``,
``low_prec_dtype`` and ``high_prec_dtype`` can be read and set directly.

Example::

    >>> import gradcore.amp as amp
    >>> a = gc.tensor([[1.0, 2.0]])
    >>> with amp.autocast():
    ...     y = F.matmul(a, a.T)
    >>> y.dtype, y.numpy()
    (dtype('float16'), array([[5.]], dtype=float16))
    >>> amp.enabled
    False
"""
from __future__ import annotations

import functools
import sys
import types
from typing import Callable, Iterable, List, Optional, Union

import numpy as np

from . import _core, dtypes as _dtypes
from ._core import Tensor
from .autodiff import GradManager
from .functional.creation import full_like
from .functional.elemwise import isinf, isnan
from .ops.conv import Convolution, ConvTranspose
from .ops.elemwise import Elemwise
from .ops.linalg import MatrixMul
from .ops.loss import CrossEntropy
from .ops.nn import LogSoftmax, LogSumExp, Softmax
from .ops.shape import cast_to

__all__ = ["autocast", "GradScaler", "enabled", "low_prec_dtype", "high_prec_dtype"]

_LOW_OPS = (MatrixMul, Convolution, ConvTranspose)
# MegEngine composes these of exp and log, which it computes in the high precision
_HIGH_OPS = (LogSoftmax, Softmax, LogSumExp, CrossEntropy)
# MegEngine's elementwise modes computed in the high precision under autocast
_HIGH_MODES = frozenset({"div", "pow", "exp", "expm1", "log", "log1p", "acos", "asin", "cos", "sin", "tan",
                         "asinh", "acosh", "atanh", "sinh", "cosh", "softplus", "logsigmoid", "sqrt"})

_state = {"enabled": False, "low": np.dtype("float16"), "high": np.dtype("float32")}


def _float_dtype(name: str, dtype) -> np.dtype:
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    if d is None or d.kind != "f":
        raise TypeError(f"amp: {name} must be a floating-point dtype, got {dtype!r}")
    return d


def _cast_inputs(op, args: tuple) -> tuple:
    """The core's autocast hook: ``args`` cast as the op's kind asks."""
    kind = type(op)
    if kind is Elemwise and op.mode in _HIGH_MODES or kind in _HIGH_OPS:
        # the floating inputs only (cross_entropy's labels stay integers;
        # these ops make floats of integer inputs anyway)
        high = _state["high"]
        want = tuple(high if a.dtype.kind == "f" else a.dtype for a in args)
    elif kind in _LOW_OPS and (kind is MatrixMul or args[0].ndim <= 4):
        # (MegEngine's 3-d convolution is left to the ordinary promotion)
        want = (_state["low"],) * len(args)
    else:
        return args
    cast = _dtypes.cast_inputs(args, want, cast_to)
    return args if cast is None else cast


def _apply_state() -> None:
    """Hand the mode to the core (its hook) and to the ops (gradcore.dtypes)."""
    on = bool(_state["enabled"])
    _dtypes.set_autocast_dtypes((_state["low"], _state["high"]) if on else None)
    _core._install_hooks(autocast=_cast_inputs if on else None)


class autocast:  # noqa: N801 (MegEngine's name)
    """Autocast mode (see the module's docstring) inside a ``with`` block,
    or around every call of a function it decorates; the previous mode
    comes back on exit. ``enabled=False`` changes nothing.

    Example::

        >>> import gradcore.amp as amp
        >>> @amp.autocast()
        ... def f(x, w):
        ...     return F.linear(x, w)
        >>> f(gc.tensor([[1.0, 2.0]]), gc.tensor([[3.0, 4.0]])).dtype
        dtype('float16')
    """

    def __init__(self, enabled: bool = True, low_prec_dtype: str = "float16", high_prec_dtype: str = "float32"):
        self.enabled = bool(enabled)
        self.low_prec_dtype = _float_dtype("low_prec_dtype", low_prec_dtype)
        self.high_prec_dtype = _float_dtype("high_prec_dtype", high_prec_dtype)
        self._saved: List[dict] = []      # a stack: the same object may be entered again inside itself

    def __enter__(self) -> "autocast":
        if self.enabled:
            self._saved.append(dict(_state))
            _state.update(enabled=True, low=self.low_prec_dtype, high=self.high_prec_dtype)
            _apply_state()
        return self

    def __exit__(self, *exc) -> bool:
        if self.enabled:
            _state.update(self._saved.pop())
            _apply_state()
        return False

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return wrapper


class GradScaler:
    """Loss scaling for float16 training (MegEngine's ``amp.GradScaler``):
    ``backward`` multiplies the output gradient by ``scale_factor`` and,
    unless ``unscale_grad=False``, unscales the attached tensors' gradients
    and updates the factor. A step whose gradients hold an inf or a NaN
    drops them all (``.grad`` None: the optimizer skips those tensors) and
    multiplies the factor by ``backoff_factor``; after ``growth_interval``
    finite steps in a row it is multiplied by ``growth_factor``. With
    ``growth_interval=0`` the factor is fixed and gradients are only
    unscaled.

    Example::

        >>> import gradcore.amp as amp
        >>> w = gc.Parameter([1.0, 2.0])
        >>> gm, scaler = gc.GradManager().attach([w]), amp.GradScaler(init_scale=8.0)
        >>> with gm:
        ...     scaler.backward(gm, (w * w).sum())
        >>> w.grad.numpy()          # scaled by 8 in the backward, unscaled after
        array([2., 4.], dtype=float32)
    """

    def __init__(self, init_scale: float = 2.0 ** 4, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self.scale_factor = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        if not self.scale_factor > 0:
            raise ValueError(f"GradScaler: init_scale must be > 0, got {init_scale!r}")
        if self.growth_interval < 0:
            raise ValueError(f"GradScaler: growth_interval must be >= 0, got {growth_interval!r}")
        self._growth_tracker = 0
        self._found_non_finite = False

    def backward(self, gm: GradManager, y: Union[Tensor, List[Tensor], None] = None,
                 dy: Union[Tensor, List[Tensor], None] = None, *, unscale_grad: bool = True,
                 update_scale: bool = True) -> None:
        """``gm.backward(y, dy * scale_factor)`` (``dy`` default ones), then,
        when ``unscale_grad``, ``unscale`` of ``gm``'s attached tensors and,
        when ``update_scale`` too, ``update``. ``unscale_grad=False`` keeps
        the gradients scaled (to accumulate several batches first).

        Example::

            >>> import gradcore.amp as amp
            >>> w = gc.Parameter([3.0])
            >>> gm, scaler = gc.GradManager().attach([w]), amp.GradScaler(init_scale=4.0)
            >>> with gm:
            ...     scaler.backward(gm, w * 2, unscale_grad=False)
            >>> w.grad.numpy()           # 2 * 4, still scaled
            array([8.], dtype=float32)
        """
        ys = [] if y is None else list(y) if isinstance(y, (tuple, list)) else [y]
        if dy is None:
            dys = [full_like(t, self.scale_factor) for t in ys]
        else:
            dys = [d * self.scale_factor for d in (dy if isinstance(dy, (tuple, list)) else [dy])]
        gm.backward(ys, dys)
        if unscale_grad:
            self.unscale(gm.attached_tensors())
            if update_scale:
                self.update()

    def unscale(self, grad_tensors: Iterable[Tensor]) -> "GradScaler":
        """Divide each tensor's ``.grad`` by ``scale_factor``; if any of
        them holds an inf or a NaN, set every ``.grad`` to None instead and
        remember it for ``update``. Tensors without a gradient are skipped.

        Example::

            >>> import gradcore.amp as amp
            >>> w = gc.Parameter([1.0])
            >>> w.grad = gc.tensor([32.0])
            >>> amp.GradScaler(init_scale=16.0).unscale([w]).scale_factor, w.grad.numpy()
            (16.0, array([2.], dtype=float32))
        """
        tensors = [t for t in grad_tensors if t is not None and getattr(t, "grad", None) is not None]
        inv = 1.0 / self.scale_factor
        if self.growth_interval and any(_non_finite(t.grad) for t in tensors):
            self._found_non_finite = True
            for t in tensors:
                t.grad = None
            return self
        for t in tensors:
            t.grad = t.grad * inv
        return self

    def update(self, new_scale: Optional[float] = None) -> None:
        """The factor after a step: ``new_scale`` when given, else backed off
        after non-finite gradients, or grown after ``growth_interval``
        finite steps. Does nothing when ``growth_interval`` is 0.

        Example::

            >>> import gradcore.amp as amp
            >>> s = amp.GradScaler(init_scale=4.0, growth_interval=2)
            >>> s.update(); s.scale_factor
            4.0
            >>> s.update(); s.scale_factor
            8.0
        """
        if self.growth_interval == 0:
            return
        if new_scale is not None:
            self.scale_factor = float(new_scale)
        elif self._found_non_finite:
            self.scale_factor *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker >= self.growth_interval:
                self.scale_factor *= self.growth_factor
                self._growth_tracker = 0
        self._found_non_finite = False

    def state_dict(self) -> dict:
        """The scaler's state, for ``load_state_dict`` (MegEngine's keys).

        Example::

            >>> import gradcore.amp as amp
            >>> amp.GradScaler().state_dict()["scale_factor"]
            16.0
        """
        return {"scale_factor": self.scale_factor, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``.

        Example::

            >>> import gradcore.amp as amp
            >>> s = amp.GradScaler()
            >>> s.load_state_dict(amp.GradScaler(init_scale=2.0).state_dict()); s.scale_factor
            2.0
        """
        self.scale_factor = float(state["scale_factor"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])


def _non_finite(g: Tensor) -> bool:
    return bool((isinf(g) | isnan(g)).sum().item())


class _AmpModule(types.ModuleType):
    """The module's type: ``amp.enabled = True`` (MegEngine's module
    properties) turns the mode on as ``autocast`` does."""

    @property
    def enabled(self) -> bool:
        return bool(_state["enabled"])

    @enabled.setter
    def enabled(self, value: bool) -> None:
        _state["enabled"] = bool(value)
        _apply_state()

    @property
    def low_prec_dtype(self) -> str:
        return _state["low"].name

    @low_prec_dtype.setter
    def low_prec_dtype(self, dtype) -> None:
        _state["low"] = _float_dtype("low_prec_dtype", dtype)
        _apply_state()

    @property
    def high_prec_dtype(self) -> str:
        return _state["high"].name

    @high_prec_dtype.setter
    def high_prec_dtype(self, dtype) -> None:
        _state["high"] = _float_dtype("high_prec_dtype", dtype)
        _apply_state()


sys.modules[__name__].__class__ = _AmpModule
