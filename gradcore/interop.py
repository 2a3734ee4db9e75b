"""Zero-copy exchange with NumPy, PyTorch, CuPy, Numba: DLPack and
``__cuda_array_interface__``.

- ``Tensor.__dlpack__`` / ``__dlpack_device__``: ``np.from_dlpack(t)`` and
  ``torch.from_dlpack(t)`` view ``t``'s memory (cpu through NumPy's own
  capsule, cuda through ``gradcore.cuda.dlpack``'s).
- ``Tensor.__cuda_array_interface__`` (cuda tensors only): CuPy and Numba
  view a cuda tensor's memory.
- ``gradcore.from_dlpack(obj)``: a Tensor viewing the memory of anything
  with ``__dlpack__`` (or, on cuda, ``__cuda_array_interface__``), or of a
  DLPack capsule.

Shared memory carries no history: a Tensor made by ``from_dlpack`` is a
leaf, the exported array has no gradient, and a write through the other
library is not seen by gradcore's in-place checks on values saved for
backward (do not write into a tensor a recorded op still needs).

Writes through the other library are seen by gradcore, but gradcore's own
in-place updates (``t[i] = v``, ``t += 1``, ``t[...] = 0``) are recorded ops:
they give ``t`` a new buffer and leave the old one as it was (a recorded op
may still need the old values for its gradient). A NumPy or PyTorch view
made before the update keeps showing the old values; export again
(``torch.from_dlpack(t)``) after updating, or update through the other
library (``u = torch.from_dlpack(t); u[0] = 5``), which writes into the
shared buffer.

A tensor with negative strides (a reversed view such as ``t[::-1]``) is
not exported as a view: DLPack consumers mishandle negative strides
(PyTorch aborts the process on them), so ``__dlpack__`` raises
``BufferError`` and names the fix, ``t[::-1].copy()``, as NumPy refuses to
export a read-only array. A consumer that asks for a copy (``copy=True``,
e.g. ``np.from_dlpack(t, copy=True)``) gets a contiguous copy.

Example::

    >>> import numpy as np, gradcore as gc
    >>> a = np.zeros(3, np.float32)
    >>> t = gc.from_dlpack(a)
    >>> a[0] = 5
    >>> t.numpy()
    array([5., 0., 0.], dtype=float32)
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ._core import Tensor, wrap_array

_CPU_DEVICE_TYPES = (1, 3)        # kDLCPU, kDLCUDAHost (host-visible)
_CUDA_DEVICE_TYPES = (2, 13)      # kDLCUDA, kDLCUDAManaged


def tensor_dlpack(self: Tensor, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                  dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None):
    """``Tensor.__dlpack__``: a DLPack capsule viewing the tensor's memory
    (the array API standard's signature; ``stream`` must be None on cpu).
    A tensor with negative strides raises ``BufferError`` unless ``copy`` is
    True (then a contiguous copy is exported): see the module docstring.

    Example::

        >>> t = gc.tensor([1.0, 2.0, 3.0])
        >>> np.from_dlpack(t).tolist()
        [1.0, 2.0, 3.0]
    """
    data = self._data
    if self._device == "cpu" and any(s < 0 for s in data.strides):
        if not copy:
            raise BufferError(
                f"__dlpack__: this tensor (shape {tuple(data.shape)}) has negative strides (a reversed view "
                f"such as t[::-1]), which DLPack consumers such as PyTorch cannot import; export a contiguous "
                f"copy: t[::-1].copy() (or ask the consumer for a copy, copy=True)")
        data, copy = np.ascontiguousarray(data), None     # the copy asked for, made here
    return data.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)


def tensor_dlpack_device(self: Tensor) -> Tuple[int, int]:
    """``Tensor.__dlpack_device__``: (device type, device id), e.g. (1, 0) on cpu."""
    return self._data.__dlpack_device__()


def tensor_cuda_array_interface(self: Tensor) -> dict:
    """``Tensor.__cuda_array_interface__``; an AttributeError on a cpu tensor
    (so ``hasattr`` says whether a tensor has one, as CuPy and Numba ask)."""
    if self._device != "cuda":
        raise AttributeError("__cuda_array_interface__: only cuda tensors have one "
                             f"(this tensor is on {self._device}); use __dlpack__ or numpy()")
    return self._data.__cuda_array_interface__


class _CapsuleHolder:
    """Gives a bare DLPack capsule the ``__dlpack__`` protocol (NumPy's
    ``from_dlpack`` takes objects, not capsules)."""

    def __init__(self, capsule):
        from .cuda import dlpack
        self._capsule = capsule
        self._device = dlpack.capsule_device(capsule)

    def __dlpack__(self, **_ignored):
        return self._capsule

    def __dlpack_device__(self):
        return self._device


def _checked_dtype(obj, arr):
    # the same refusal as Tensor(data): complex, strings... are not computed in
    if arr.dtype.kind not in "biuf" or arr.dtype.itemsize > 8:
        raise TypeError(f"gradcore.from_dlpack: {type(obj).__name__} of dtype {arr.dtype} (shape "
                        f"{tuple(arr.shape)}) cannot be shared; gradcore computes in bool, integers and "
                        f"float16/float32/float64")
    return arr


def from_dlpack(obj: Any) -> Tensor:
    """A Tensor sharing memory with ``obj``: a NumPy array, a PyTorch, CuPy
    or JAX array, anything with ``__dlpack__``, a DLPack capsule, or (cuda)
    anything with ``__cuda_array_interface__``. No copy is made; ``obj``'s
    memory stays alive as long as the tensor does.

    Writes through ``obj`` are seen by the tensor. An in-place update on
    gradcore's side (``t[i] = v``, ``t += 1``) is a recorded op that gives
    the tensor a new buffer: ``obj`` keeps the old values and no longer
    shares memory with ``t`` (docs/interop.md).

    The memory is shared, and so are writes: a value that gradcore saved for
    a backward (the input of a ``mul``, say) is read again by that backward,
    so changing ``obj`` in place (``torch``'s ``mul_``, ``copy_``...) between
    the forward and the backward gives a gradient computed from the new
    values. gradcore cannot see the exporter's writes (DLPack carries no
    version counter); clone the buffer first (``gradcore.tensor(obj)``, a
    copy) if the exporter writes it while a recording uses it.

    Example::

        >>> t = gradcore.from_dlpack(torch.arange(3.0))     # doctest: +SKIP
    """
    if type(obj).__name__ == "PyCapsule":
        obj = _CapsuleHolder(obj)
    if hasattr(obj, "__dlpack__"):
        device_type, _device_id = obj.__dlpack_device__()
        if device_type in _CPU_DEVICE_TYPES:
            try:
                arr = np.from_dlpack(obj)
            except (RuntimeError, TypeError, ValueError) as exc:
                if "dtype" not in str(exc):
                    raise
                raise TypeError(f"gradcore.from_dlpack: {type(obj).__name__} of dtype "
                                f"{getattr(obj, 'dtype', '?')} cannot be shared; gradcore computes in bool, "
                                f"integers and float16/float32/float64 (convert first, e.g. "
                                f"x.to(torch.float32))") from None
            return wrap_array(_checked_dtype(obj, arr), "cpu")
        if device_type in _CUDA_DEVICE_TYPES:
            from .cuda import backend, dlpack
            from .cuda.array import DeviceArray
            try:
                capsule = obj.__dlpack__(stream=1, max_version=(dlpack.DLPACK_MAJOR, dlpack.DLPACK_MINOR))
            except TypeError:          # a producer older than DLPack 1.0's max_version
                capsule = obj.__dlpack__(stream=1)
            return wrap_array(_checked_dtype(obj, dlpack.import_capsule(capsule, backend(), DeviceArray)), "cuda")
        raise BufferError(f"gradcore.from_dlpack: {type(obj).__name__} lives on DLPack device type "
                          f"{device_type}; gradcore has cpu (1) and cuda (2)")
    if hasattr(obj, "__cuda_array_interface__"):
        from .cuda import backend, dlpack
        from .cuda.array import DeviceArray
        return wrap_array(_checked_dtype(obj, dlpack.from_interface(obj, backend(), DeviceArray)), "cuda")
    raise TypeError(f"gradcore.from_dlpack: {type(obj).__name__} has neither __dlpack__ nor "
                    f"__cuda_array_interface__")
