"""The CUDA backend: device arrays, kernel loading and launching, and the
helpers every op's ``cuda`` launcher uses.

An op runs on ``cuda`` through its ``cuda(self, be, *arrays)`` method, next
to its ``cpu`` kernel and its ``cuda_source``: it takes ``DeviceArray``
inputs and the ``Backend`` ``be``, allocates outputs with ``be.empty``, gets
its compiled kernel with ``be.kernel(self, ctype)`` and launches it with
``be.launch_n`` (1-D, grid-stride) or ``be.launch`` (any grid)::

    def cuda(self, be, x):
        y = be.empty(x.shape, x.dtype)
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, y, np.int64(y.size))
        return y

Kernel arguments: a ``DeviceArray`` (or None) is a pointer, a NumPy scalar
(``np.int32(3)``, ``np.float32(0.5)``) is that C type, a Python int is a
``long long``, ``be.dims(shape)`` is a ``gc_dims`` struct passed by value.
They are packed into one buffer exactly as the CUDA ABI lays out kernel
parameters (``pack_params``).
"""
from __future__ import annotations

import ctypes
import re
import struct
import threading
from typing import Optional, Sequence

import numpy as np

from .array import DeviceArray
from .driver import CudaUnavailable, open_driver
from .memory import MemoryPool

MAX_DIMS = 8
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(')

CTYPES = {"float32": "float", "float64": "double", "int8": "signed char",
          "int16": "short", "int32": "int", "int64": "long long", "uint8": "unsigned char",
          "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long",
          "bool": "bool"}


_CTYPE_OF = {}      # dtype (or anything np.dtype accepts) -> C type


class Dims(ctypes.Structure):
    """``struct gc_dims { int n; long long d[GC_MAX_DIMS]; }`` (ops/indexing.py)."""
    _fields_ = [("n", ctypes.c_int), ("d", ctypes.c_longlong * MAX_DIMS)]


def _param_layout(i, a):
    """(struct code, alignment, value getter) of kernel argument ``a``."""
    if isinstance(a, DeviceArray):
        return "Q", 8, _pointer
    if a is None:
        return "8x", 8, None
    if isinstance(a, Dims):
        return f"{ctypes.sizeof(Dims)}s", ctypes.alignment(Dims), bytes
    if isinstance(a, np.generic):
        return f"{a.dtype.itemsize}s", a.dtype.alignment, _scalar_bytes
    if isinstance(a, bool):
        raise TypeError(f"kernel argument {i}: pass np.bool_({a}) (a bool is ambiguous)")
    if isinstance(a, int):
        return "q", 8, None
    if isinstance(a, float):
        raise TypeError(f"kernel argument {i}: pass np.float32({a}) or np.float64({a}), the kernel's C type")
    raise TypeError(f"kernel argument {i}: cannot pass a {type(a).__name__} to a kernel")


def _pointer(a):
    if a.ptr == 0 and a.size:
        raise ValueError(f"a shape-only array (no device memory) of shape {a.shape} cannot be read by a kernel")
    return a.ptr


def _scalar_bytes(a):
    return a.tobytes()


_layouts = {}       # argument type signature -> (struct.Struct, per-argument getters)


def pack_params(args: Sequence) -> bytes:
    """Kernel arguments as one buffer in the CUDA ABI's layout: each
    parameter at an offset aligned to its own alignment, in order. The
    layout is computed once per signature of argument types."""
    sig = tuple([type(a) if type(a) is not np.ndarray and not isinstance(a, np.generic) else a.dtype
                 for a in args])
    layout = _layouts.get(sig)
    if layout is None:
        fmt, getters, offset = "<", [], 0
        for i, a in enumerate(args):
            code, align, get = _param_layout(i, a)
            pad = -offset % align
            fmt += f"{pad}x" if pad else ""
            fmt += code
            offset += pad + struct.calcsize("<" + code)
            getters.append(get)
        layout = _layouts[sig] = (struct.Struct(fmt), tuple(getters))
    packer, getters = layout
    values = [a if g is None else g(a) for a, g in zip(args, getters) if a is not None]
    return packer.pack(*values)


class Kernel:
    __slots__ = ("fn", "name")

    def __init__(self, fn, name):
        self.fn, self.name = fn, name

    def __repr__(self):
        return f"Kernel({self.name})"


def _op_label(op) -> str:
    fn = getattr(op, "_name", None)
    return fn() if callable(fn) else str(getattr(op, "name", type(op).__name__))


class Backend:
    """One CUDA device: its driver (PyCUDA, or the host emulator), memory
    pool and loaded kernels. ``gradcore.cuda.backend()`` returns the
    process's backend."""

    threads = 256

    def __init__(self, driver):
        self.driver = driver
        self.pool = MemoryPool(driver)
        self._kernels = {}
        self._modules = {}
        self._seeds = {}
        self._lock = threading.Lock()

    def __repr__(self):
        return f"Backend({self.driver!r})"

    @property
    def name(self) -> str:
        return self.driver.name

    # ------------------------------------------------------------ arrays
    def empty(self, shape, dtype) -> DeviceArray:
        out = DeviceArray(self, shape, dtype)
        if out.nbytes:
            out._block = block = self.pool.malloc(out.nbytes)
            out.ptr = block.ptr
        return out

    def zeros(self, shape, dtype) -> DeviceArray:
        out = self.empty(shape, dtype)
        if out.nbytes:
            self.driver.memset0(out.ptr, out.nbytes)
        return out

    def ones_seed(self, shape, dtype) -> DeviceArray:
        """Ones (the default output gradient of a backward); small ones are
        uploaded once and shared: a seed is never written (slots do not own it)."""
        key = (shape, dtype)
        out = self._seeds.get(key)
        if out is None:
            out = self.full(shape, 1, dtype)
            if out.size <= 256:
                if len(self._seeds) > 256:
                    self._seeds.clear()
                self._seeds[key] = out
        return out

    def full(self, shape, value, dtype) -> DeviceArray:
        return self.to_device(np.full(shape, value, dtype))

    def to_device(self, host, dtype=None) -> DeviceArray:
        host = np.asarray(host, dtype=dtype, order="C")     # keeps 0-d (ascontiguousarray would not)
        if host.dtype == object:
            raise TypeError("cuda: arrays of Python objects cannot live on the GPU")
        out = self.empty(host.shape, host.dtype)
        if out.nbytes:
            self.driver.htod(out.ptr, host)
        return out

    def asarray(self, x, dtype=None) -> DeviceArray:
        """``x`` as a DeviceArray: device arrays as they are (cast to
        ``dtype`` when given), host arrays and scalars copied over."""
        if isinstance(x, DeviceArray):
            return x if dtype is None or np.dtype(dtype) == x.dtype else self.cast(x, dtype)
        return self.to_device(np.asarray(x, dtype=dtype))

    def shape_only(self, shape, dtype) -> DeviceArray:
        """An array with a shape and a dtype and no memory: what a backward
        graph keeps of a tensor it reads only the shape of."""
        return DeviceArray(self, shape, dtype)

    @staticmethod
    def dims(shape) -> Dims:
        shape = tuple(shape)
        if len(shape) > MAX_DIMS:
            raise ValueError(f"cuda kernels take at most {MAX_DIMS} dimensions, got shape {shape}")
        return Dims(len(shape), (ctypes.c_longlong * MAX_DIMS)(*shape))

    @staticmethod
    def ctype(dtype) -> str:
        c = _CTYPE_OF.get(dtype)
        if c is None:
            name = np.dtype(dtype).name
            if name not in CTYPES:
                hint = "; cast to float32 (float16 kernels are not written yet)" if name == "float16" else ""
                raise TypeError(f"cuda: no kernels for dtype {name}{hint}")
            c = _CTYPE_OF[dtype] = CTYPES[name]
        return c

    # ------------------------------------------------------------ kernels
    def kernel(self, op, ctype: str, name: Optional[str] = None, source: Optional[str] = None) -> Kernel:
        """The compiled kernel of ``op`` for element type ``ctype`` (from
        ``op.cuda_source(ctype)``, or ``source``); ``name`` picks one when
        the source defines several. Loaded once per process; compiled once
        per machine (the disk cache)."""
        key = (op, ctype, name, source)
        k = self._kernels.get(key)
        if k is not None:
            return k
        src = op.cuda_source(ctype) if source is None else source
        found = _KERNEL.findall(src)
        if name is None:
            if len(found) != 1:
                raise ValueError(f"{_op_label(op)}: its {ctype} source defines kernels {found}; name one")
            name = found[0]
        elif name not in found:
            raise ValueError(f"{_op_label(op)}: no kernel {name!r} in its {ctype} source (it has {found})")
        with self._lock:
            # ops whose sources do not depend on their attributes (shapes are
            # kernel arguments) share one module per source
            module = self._modules.get(src)
            if module is None:
                module = self._modules[src] = self.driver.load(name, src)
            k = self._kernels[key] = Kernel(self.driver.function(module, name), name)
        return k

    def launch(self, kernel: Kernel, grid, block, *args, shared: int = 0) -> None:
        self.driver.launch(kernel.fn, grid, block, pack_params(args), shared)

    def launch_n(self, kernel: Kernel, n: int, *args) -> None:
        """Launch with one thread per element of ``n`` (1-D grid; the
        standard kernels are grid-stride loops, so any grid is correct)."""
        if n <= 0:
            return
        t = self.threads
        grid = min((n + t - 1) // t, 2 ** 31 - 1)
        self.launch(kernel, (grid, 1, 1), (t, 1, 1), *args)

    def synchronize(self) -> None:
        self.driver.synchronize()

    def gemm(self, transa: bool, transb: bool, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
             beta, c, ldc, stride_c, batch, dtype) -> None:
        """cuBLAS ``<S|D>gemmStridedBatched`` (column-major), pointers as ints."""
        self.driver.gemm(bool(transa), bool(transb), int(m), int(n), int(k), float(alpha), int(a), int(lda),
                         int(stride_a), int(b), int(ldb), int(stride_b), float(beta), int(c), int(ldc),
                         int(stride_c), int(batch), np.dtype(dtype))

    # ------------------------------------------------------------ array helpers (standard ops' kernels)
    def run(self, op, *arrays):
        """Run ``op``'s cuda launcher on device arrays."""
        return op.cuda(self, *arrays)

    def cast(self, x: DeviceArray, dtype) -> DeviceArray:
        from gradcore.ops.shape import Cast
        return x if np.dtype(dtype) == x.dtype else Cast(dtype).cuda(self, x)

    def broadcast_to(self, x: DeviceArray, shape) -> DeviceArray:
        from gradcore.ops.shape import Broadcast
        shape = tuple(shape)
        return x if x.shape == shape else Broadcast(shape).cuda(self, x)

    def transpose(self, x: DeviceArray, perm) -> DeviceArray:
        from gradcore.ops.shape import Transpose
        return Transpose(tuple(perm)).cuda(self, x)

    def reduce(self, mode: str, x: DeviceArray, axis=None, keepdims: bool = False) -> DeviceArray:
        from gradcore.ops.reduce import Reduce
        if isinstance(axis, list):
            axis = tuple(axis)
        return Reduce(mode, axis, keepdims).cuda(self, x)

    def fill(self, x: DeviceArray, value) -> None:
        if x.nbytes:
            src = self.to_device(np.full((), value, x.dtype))
            filled = self.broadcast_to(src, x.shape)
            self.driver.dtod(x.ptr, filled.ptr, x.nbytes)

    def elementwise(self, mode: str, *operands) -> DeviceArray:
        """An ``Elemwise(mode)`` on device arrays and Python/NumPy scalars
        (scalars take the array's dtype, as NumPy's weak scalars do)."""
        from gradcore.ops.elemwise import Elemwise
        like = next(o for o in operands if isinstance(o, DeviceArray))
        arrays = [o if isinstance(o, DeviceArray) else self.to_device(_weak_scalar(o, like.dtype))
                  for o in operands]
        return Elemwise(mode).cuda(self, *arrays)

    def ufunc(self, ufunc, method, inputs, out, kwargs):
        """``__array_ufunc__``: NumPy ufuncs on device arrays, through the
        elementwise table; ``out=`` writes into a device array."""
        mode = _UFUNC_MODES.get(ufunc.__name__)
        if method != "__call__" or mode is None or kwargs:
            return NotImplemented
        res = self.elementwise(mode, *inputs)
        if out is None:
            return res
        (target,) = out
        if not isinstance(target, DeviceArray):
            raise ValueError(f"cuda: np.{ufunc.__name__}(out=...) needs a device array")
        return self.copy_into(target, res)

    def copy_into(self, target: DeviceArray, value: DeviceArray) -> DeviceArray:
        """Write ``value`` (cast to target's dtype) into ``target``'s buffer."""
        if value.shape != target.shape:
            raise ValueError(f"cuda: cannot write a result of shape {value.shape} into an array of "
                             f"shape {target.shape}")
        value = self.cast(value, target.dtype)
        if value.nbytes and value.ptr != target.ptr:
            self.driver.dtod(target.ptr, value.ptr, value.nbytes)
        return target


def _weak_scalar(value, dtype):
    value = np.asarray(value)
    if value.ndim:
        return value
    if value.dtype.kind == "f" and dtype.kind != "f":
        return value.astype(np.float64)
    if value.dtype.kind == "b" and dtype.kind != "b":
        return value.astype(dtype)
    return value.astype(dtype)


_UFUNC_MODES = {"add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "div", "divide": "div",
                "negative": "neg", "power": "pow", "maximum": "maximum", "minimum": "minimum",
                "sqrt": "sqrt", "exp": "exp", "log": "log", "abs": "abs", "absolute": "abs", "square": "square",
                "tanh": "tanh", "sin": "sin", "cos": "cos", "sign": "sign", "less": "lt", "greater": "gt",
                "equal": "eq", "not_equal": "ne", "less_equal": "le", "greater_equal": "ge",
                "floor": "floor", "ceil": "ceil"}


# ---------------------------------------------------------------- the process's backend
_backend: Optional[Backend] = None
_error: Optional[str] = None
_state_lock = threading.Lock()
_by_kind = {}       # one backend per driver kind: its loaded kernels survive a switch


def backend() -> Backend:
    """The process's CUDA backend, created on first use (a GPU through
    PyCUDA; ``$GRADCORE_CUDA=emulator`` selects the host emulator). Raises
    ``CudaUnavailable`` saying why when there is none."""
    global _backend, _error
    if _backend is not None:
        return _backend
    with _state_lock:
        if _backend is None:
            try:
                _backend = Backend(open_driver())
                _error = None
            except CudaUnavailable as exc:
                _error = str(exc)
                raise
    return _backend


def use(kind) -> Optional[Backend]:
    """Select the backend: "gpu", "emulator", a ``Backend`` instance, or
    None (forget it; the next use picks again). Returns the backend. Arrays
    made by an earlier backend keep working with that one."""
    global _backend, _error
    with _state_lock:
        _backend, _error = None, None
        _forget_device_state()
        if kind is None:
            return None
        if isinstance(kind, Backend):
            _backend = kind
            return kind
        be = _by_kind.get(kind)
        if be is None:
            be = _by_kind[kind] = Backend(open_driver(kind))
        _backend = be
        return be


def _forget_device_state():
    """Backward graphs and scalar constants compiled for the previous
    backend hold its arrays: drop them when the backend changes."""
    from gradcore import graph, tensor_methods
    graph.clear_cache()
    tensor_methods._scalars.clear()


def unavailable_reason() -> Optional[str]:
    """None when ``cuda`` works here, else why not."""
    try:
        backend()
        return None
    except CudaUnavailable as exc:
        return str(exc)


__all__ = ["Backend", "Dims", "DeviceArray", "Kernel", "pack_params", "backend", "use",
           "unavailable_reason", "CudaUnavailable", "CTYPES"]
