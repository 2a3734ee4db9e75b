"""Anomaly mode: find the op whose backward produced NaN or Inf.

``with gradcore.autodiff.detect_anomaly():`` (as PyTorch's
``torch.autograd.detect_anomaly``) makes every op recorded inside it keep
the Python stack of its forward call, and every backward node run inside
it check the gradients it returns: the first NaN or Inf raises
``AnomalyError`` naming the op, the input and its shape, and showing where
that op's forward was called.

Off (the default), the core pays one C flag check per recorded node and
nothing else; on, recording is much slower (a stack capture per op) and so
is backward (a finiteness check per gradient): a debugging tool.

Example::

    >>> from gradcore.autodiff import GradManager, detect_anomaly
    >>> x = gradcore.tensor([0.0, 1.0])
    >>> gm = GradManager().attach(x)
    >>> with detect_anomaly(), gm:               # doctest: +SKIP
    ...     gm.backward(F.sqrt(x).sum())          # AnomalyError: sqrt's backward returned inf ...
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import traceback
from typing import NamedTuple, Tuple
import numpy as np

from . import _core
from .op import op_label

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_internal_dirs = None       # gradcore's and gradcore.ops' folders (ops/ lives apart in a source tree)


def _internal_prefixes() -> tuple:
    global _internal_dirs
    if _internal_dirs is None:
        from . import ops
        _internal_dirs = (_PACKAGE_DIR,) + tuple(os.path.abspath(p) + os.sep for p in ops.__path__)
    return _internal_dirs


class AnomalyError(RuntimeError):
    """A backward produced NaN or Inf under ``detect_anomaly``."""


class RecordInfo(NamedTuple):
    """What anomaly mode keeps of each recorded op."""
    frames: Tuple[Tuple, ...]              # (code, line) where its forward was called, innermost first
    inputs: Tuple[Tuple, ...]              # (shape, dtype) per input
    outputs: Tuple[Tuple, ...]             # (shape, dtype) per output

    @property
    def stack(self) -> traceback.StackSummary:
        """The forward's call site as a traceback (outermost first)."""
        return traceback.StackSummary.from_list(
            [(code.co_filename, line, code.co_name, None) for code, line in reversed(self.frames)])


def _meta(t) -> Tuple:
    return (tuple(t.shape), t.dtype) if isinstance(t, _core.Tensor) else (None, None)


class _Hooks:
    """What the core calls in anomaly mode."""

    def __init__(self, check_nan: bool):
        self.check_nan = check_nan

    @staticmethod
    def capture(op, inputs, outputs) -> "RecordInfo":
        # (code, line) pairs, innermost first: made into a StackSummary (and
        # source lines read) only if an error shows them
        frames = []
        frame = sys._getframe(1)
        internal = _internal_prefixes()
        while frame is not None:
            if frames or not frame.f_code.co_filename.startswith(internal):   # skip gradcore's own frames
                frames.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        outputs = (outputs,) if isinstance(outputs, _core.Tensor) else outputs
        return RecordInfo(tuple(frames), tuple(_meta(t) for t in inputs), tuple(_meta(t) for t in outputs))

    def check(self, op, info, grads, n_inputs: int) -> None:
        if not self.check_nan:
            return
        grads = (grads,) if n_inputs == 1 else grads
        for i, g in enumerate(grads):
            if g is None:
                continue
            arr = g._data if isinstance(g, _core.Tensor) else g
            # a cuda array is checked on the host (a debugging mode: speed is not the point)
            arr = arr.get() if hasattr(arr, "get") and not isinstance(arr, np.generic) else np.asarray(arr)
            if arr.dtype.kind not in "fc" or np.isfinite(arr).all():
                continue
            what = "nan" if np.isnan(arr).any() else "inf"
            where = ("".join(traceback.format_list(info.stack)) if info is not None else
                     "  (not known: the op was recorded while anomaly mode was off)\n")
            # the forward's input shapes too: a gradient may be in the inputs'
            # broadcast shape, not its input's (summed down later)
            given = ("" if info is None or not info.inputs else "; the op's inputs: " + ", ".join(
                f"{shape} {dtype}" if shape is not None else "not a tensor" for shape, dtype in info.inputs))
            raise AnomalyError(f"{op_label(op)}: its backward returned {what} values in the gradient of "
                               f"input {i} (shape {arr.shape}, dtype {arr.dtype}{given}).\n"
                               f"The forward of {op_label(op)} was called at (most recent call last):\n{where}")


_lock = threading.Lock()
_active = []        # the hooks of each open detect_anomaly, innermost last


class detect_anomaly:
    """Context manager (and decorator) turning anomaly mode on: record-time
    stacks and NaN/Inf checks in backward (see the module docstring).
    ``check_nan=False`` keeps the stacks without the checks. Nests; the
    mode is process-wide, as PyTorch's.

    Example::

        >>> from gradcore.autodiff import detect_anomaly
        >>> x = gc.tensor([1.0, np.inf]); gm = gc.GradManager().attach([x])
        >>> with detect_anomaly(), gm:
        ...     gm.backward(F.exp(x).sum())     # d exp(x) / dx is inf at inf
        Traceback (most recent call last):
        gradcore.anomaly.AnomalyError: Elemwise(exp): its backward returned inf values in the gradient of input 0 ...
    """

    def __init__(self, check_nan: bool = True):
        self.check_nan = check_nan

    def __enter__(self) -> "detect_anomaly":
        with _lock:
            _active.append(_Hooks(self.check_nan))
            _core._set_anomaly(_active[-1])
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _active.pop()
            _core._set_anomaly(_active[-1] if _active else None)

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)
        return wrapper


def is_anomaly_enabled() -> bool:
    """Whether anomaly mode is on.

    Example::

        >>> from gradcore.autodiff import detect_anomaly, is_anomaly_enabled
        >>> with detect_anomaly():
        ...     print(is_anomaly_enabled())
        True
        >>> is_anomaly_enabled()
        False
    """
    return bool(_core._anomaly_enabled())
