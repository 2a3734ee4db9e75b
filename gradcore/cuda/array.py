"""``DeviceArray``: what a ``cuda`` Tensor holds instead of an ndarray.

A C-contiguous array in device memory: a pool ``Block`` (shared by views
such as ``reshape``), a byte offset into it, a shape and a dtype. It offers
the small part of the ndarray interface the core and the optimizers use
(shape/dtype/size, ``reshape``, ``sum``, ``copy``, ``astype``, arithmetic
and NumPy ufuncs with ``out=`` through ``__array_ufunc__``), each running
the standard ops' CUDA kernels. It never converts itself to host memory
silently: ``np.asarray(device_array)`` is a TypeError; ``.get()`` copies.

Example::

    >>> import gradcore.cuda as gcuda                   # doctest: +SKIP
    >>> a = gcuda.backend().to_device(np.arange(3.0))   # doctest: +SKIP
    >>> (a * 2).get()                                   # doctest: +SKIP
    array([0., 2., 4.])
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import dlpack
from ._launch import DeviceArrayBase, set_array_type


def _normalize_shape(shape, size: int) -> Tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: at most one -1 in {shape}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape an array of size {size} into shape {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if int(np.prod(shape, dtype=np.int64)) != size:
        raise ValueError(f"cannot reshape an array of size {size} into shape {shape}")
    return shape


class DeviceArray(DeviceArrayBase):
    """A C-contiguous array on the ``cuda`` device (see the module docstring).
    Its fields (backend, shape, dtype, size, ndim, nbytes, ptr, _block) are
    C fields of ``_launch.DeviceArrayBase``: the launch path reads them per call."""

    __slots__ = ()
    __array_priority__ = 2000

    def __init__(self, backend, shape, dtype, block=None, offset: int = 0):
        self.backend = backend
        self.shape = shape = shape if type(shape) is tuple else tuple(shape)
        self.dtype = dtype if type(dtype) is np.dtype or isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.ndim = len(shape)
        size = 1
        for s in shape:
            size *= s
        size = int(size)
        self.size = size
        self.nbytes = size * self.dtype.itemsize
        self._block = block
        self.ptr = 0 if block is None else int(block) + offset

    # ------------------------------------------------------------ host side
    def get(self) -> np.ndarray:
        """A host copy (a new, writable ndarray)."""
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            self.backend.copy_to_host(out, self.ptr)
        return out

    def item(self):
        if self.size != 1:
            raise ValueError(f"item() needs an array with one element, got shape {self.shape}")
        return self.get().item()

    def __array__(self, dtype=None, copy=None):
        raise TypeError("a cuda array is not converted to host memory implicitly; "
                        "use Tensor.numpy() or .to('cpu')")

    def __repr__(self):
        return f"DeviceArray({np.array2string(self.get(), separator=', ')}, dtype={self.dtype}, device=cuda)"

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __bool__(self):
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __index__(self):
        # NumPy's rule (Tensor.__index__ calls this): one integer element, else a TypeError
        if self.dtype.kind not in "iu" or self.size != 1 or self.shape:
            raise TypeError(f"only integer scalar arrays can be converted to a scalar index "
                            f"(got a cuda array of dtype {self.dtype} and shape {self.shape})")
        return int(self.item())

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def T(self):
        return self.transpose()

    # ------------------------------------------------------------ interop (see gradcore.cuda.dlpack)
    @property
    def __cuda_array_interface__(self) -> dict:
        return dlpack.interface(self)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (dlpack.kDLCUDA, dlpack.device_index_of(self.backend))

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this array's device memory (no copy unless
        ``copy=True``, or ``dl_device=(1, 0)`` asks for a host copy)."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            if tuple(dl_device) != (dlpack.kDLCPU, 0):
                raise BufferError(f"__dlpack__: cannot export a cuda array to device {tuple(dl_device)}")
            if copy is False:
                raise BufferError("__dlpack__: a cuda array reaches the host only by a copy, and copy=False")
            return self.get().__dlpack__(max_version=max_version, copy=True)
        return dlpack.export(self, stream=stream, max_version=max_version, copy=copy)

    # ------------------------------------------------------------ views and copies
    def reshape(self, *shape) -> "DeviceArray":
        if len(shape) == 1 and type(shape[0]) is tuple and -1 not in shape[0]:
            shape = shape[0]
            if shape == self.shape:
                return self
            size = 1
            for s in shape:
                size *= s
            if size != self.size:
                raise ValueError(f"cannot reshape an array of size {self.size} into shape {shape}")
        else:
            shape = _normalize_shape(shape, self.size)
        view = DeviceArray(self.backend, shape, self.dtype)
        view._block, view.ptr = self._block, self.ptr
        return view

    def copy(self) -> "DeviceArray":
        out = self.backend.empty(self.shape, self.dtype)
        if self.nbytes:
            self.backend.copy_on_device(out.ptr, self.ptr, self.nbytes)
        return out

    def astype(self, dtype, copy: bool = True) -> "DeviceArray":
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self.copy() if copy else self
        return self.backend.cast(self, dtype)

    def fill(self, value) -> None:
        self.backend.fill(self, value)

    def transpose(self, *axes) -> "DeviceArray":
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return self.backend.transpose(self, axes or tuple(reversed(range(self.ndim))))

    # ------------------------------------------------------------ math (standard op kernels)
    def sum(self, axis=None, keepdims: bool = False, dtype=None) -> "DeviceArray":
        r = self.backend.reduce("sum", self, axis, keepdims)
        return r if dtype is None else r.astype(dtype, copy=False)

    def mean(self, axis=None, keepdims: bool = False) -> "DeviceArray":
        return self.backend.reduce("mean", self, axis, keepdims)

    def max(self, axis=None, keepdims: bool = False) -> "DeviceArray":
        return self.backend.reduce("max", self, axis, keepdims)

    def min(self, axis=None, keepdims: bool = False) -> "DeviceArray":
        return self.backend.reduce("min", self, axis, keepdims)

    def __array_ufunc__(self, ufunc, method, *inputs, out: Optional[tuple] = None, **kwargs):
        return self.backend.ufunc(ufunc, method, inputs, out, kwargs)

    def _binary(self, mode, other, reflected=False):
        a, b = (other, self) if reflected else (self, other)
        return self.backend.elementwise(mode, a, b)

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._binary("div", o, True)
    def __pow__(self, o): return self._binary("pow", o)
    def __neg__(self): return self.backend.elementwise("neg", self)

    # in place: the result is written into this array's buffer (optimizers), by
    # the kernel itself unless the other operand overlaps this buffer otherwise
    # than element for element (then through a new array, as NumPy buffers)
    def _inplace(self, mode, other):
        be = self.backend
        if isinstance(other, DeviceArray) and other.nbytes and self.nbytes and not (
                other.ptr == self.ptr and other.shape == self.shape and other.dtype == self.dtype) and \
                other.ptr < self.ptr + self.nbytes and self.ptr < other.ptr + other.nbytes:
            be.copy_into(self, be.elementwise(mode, self, other))
            return self
        be.elementwise(mode, self, other, out=self)
        return self

    def __iadd__(self, o): return self._inplace("add", o)
    def __isub__(self, o): return self._inplace("sub", o)
    def __imul__(self, o): return self._inplace("mul", o)
    def __itruediv__(self, o): return self._inplace("div", o)


set_array_type(DeviceArray)
