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
import functools
import math
import sys
import threading
import weakref
from typing import Optional

import numpy as np

from . import _launch, events, kernels as _kernels
from ._launch import Kernel, Launcher, pack_params
from .array import DeviceArray
from .driver import CudaUnavailable, PyCudaDriver
from .memory import MemoryPool

MAX_DIMS = 8

CTYPES = {"float32": "float", "float64": "double", "int8": "signed char",
          "int16": "short", "int32": "int", "int64": "long long", "uint8": "unsigned char",
          "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long",
          "bool": "bool"}


_CTYPE_OF = {}      # dtype (or anything np.dtype accepts) -> C type
_EXTENT_ON_UPLOAD = 1 << 16     # integer uploads up to this size record their [min, max]


class Dims(ctypes.Structure):
    """``struct gc_dims { int n; long long d[GC_MAX_DIMS]; }`` (ops/indexing.py)."""
    _fields_ = [("n", ctypes.c_int), ("d", ctypes.c_longlong * MAX_DIMS)]


_launch.set_dims_type(Dims, ctypes.sizeof(Dims), ctypes.alignment(Dims))


def _op_label(op) -> str:
    fn = getattr(op, "_name", None)
    return fn() if callable(fn) else str(getattr(op, "name", type(op).__name__))


class Backend:
    """One CUDA device: its driver (PyCUDA, or the host emulator), memory
    pool and loaded kernels. ``gradcore.cuda.backend()`` returns the
    process's backend."""

    def __init__(self, driver):
        self.driver = driver
        self.pool = MemoryPool(driver)
        self._kernels = {}
        self._modules = {}
        self._seeds = {}
        self._scalars = {}
        self._consts = {}        # id -> (array, value): Python-scalar operands (constant_scalar)
        self._expanded = {}      # (id, shape) -> (constant, its value expanded to shape)
        self._extents = {}
        self._blas_entry = None
        self._blas_tf32 = False             # cuBLAS's default math: no TF32
        self._lock = threading.Lock()
        # copies between host and device, counted: a training step makes none
        # unless the user reads a value (memory_stats)
        self.copies = {"htod": 0, "dtoh": 0, "dtod": 0, "memset": 0, "htod_bytes": 0, "dtoh_bytes": 0}
        # the compiled per-call path: launches go straight to the driver's C
        # entry point (cuLaunchKernel, or the emulator's compiled launcher)
        self._bind_thread = getattr(driver, "bind_thread", None)    # a GPU's: its context per thread
        self.launcher = Launcher(driver.launch_entry(), getattr(driver, "launched", None), driver.launch,
                                 self._bind_thread)
        self.launch = self.launcher.launch
        self.launch_n = self.launcher.launch_n
        # the CUDA graph being captured (gradcore/cuda/graphs.py): host copies
        # and synchronisations are refused while it is set
        self.capture = None
        self.graph_launches = 0

    def __repr__(self):
        return f"Backend({self.driver!r})"

    @property
    def name(self) -> str:
        return self.driver.name

    # ------------------------------------------------------------ arrays
    def empty(self, shape, dtype) -> DeviceArray:
        return _launch.new_array(self.pool, self, shape, dtype)

    def zeros(self, shape, dtype) -> DeviceArray:
        out = self.empty(shape, dtype)
        self.memset0(out)
        return out

    def ones_seed(self, shape, dtype) -> DeviceArray:
        """Ones (the default output gradient of a backward), filled on the
        device; small ones are made once and shared: a seed is never written
        (slots do not own it)."""
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
        """An array of ``value``, filled by a kernel (the value travels as a
        kernel argument: no host-to-device copy)."""
        out = self.empty(shape, dtype)
        self.fill(out, value)
        return out

    def forget_filled_constants(self) -> None:
        """Drop the cached scalars and backward seeds (a failed CUDA-graph
        capture recorded their fill kernels and never ran them)."""
        self._scalars.clear()
        self._seeds.clear()
        self._expanded.clear()

    def constant_scalar(self, value, dtype) -> DeviceArray:
        """A 0-d constant of the Python scalar ``value`` (an op's operand, as
        ``x * 0.5``: uploaded once, never written, kept by the caller's
        cache), registered so that a fused backward can read it expanded
        (``expanded_constant``) instead of broadcasting it per call."""
        out = self.to_device(np.asarray(value, dtype), constant=True)
        if len(self._consts) > 4096:
            self._consts.clear()
            self._expanded.clear()
        self._consts[id(out)] = (out, value)
        return out

    def expanded_constant(self, x, shape):
        """``x`` expanded to ``shape`` when ``x`` is a ``constant_scalar``:
        filled once per (constant, shape) and shared (never written: kernels
        only read their inputs), or None. Not made inside a CUDA-graph
        capture (a fill recorded there runs only at replay), nor for large
        shapes (their broadcast costs little next to the kernel)."""
        entry = self._consts.get(id(x))
        if entry is None or entry[0] is not x:
            return None
        key = (id(x), shape)
        got = self._expanded.get(key)
        if got is not None and got[0] is x:
            return got[1]
        if self.capture is not None:
            return None
        size = math.prod(shape)
        if size > 65536:
            return None
        if len(self._expanded) > 256:
            self._expanded.clear()
        out = self.full(shape, entry[1], x.dtype)
        self._expanded[key] = (x, out)
        return out

    def to_device(self, host, dtype=None, constant: bool = False) -> DeviceArray:
        """A device copy of ``host``. ``constant``: a value the caller keeps for
        the process (a compiled graph's constant): allowed, and copied at once,
        inside a CUDA-graph capture, where any other upload is refused."""
        host = np.asarray(host, dtype=dtype, order="C")     # keeps 0-d (ascontiguousarray would not)
        if host.dtype == object:
            raise TypeError("cuda: arrays of Python objects cannot live on the GPU")
        if constant and self.capture is not None:
            out = self.capture.empty_outside(host.shape, host.dtype)
        else:
            out = self.empty(host.shape, host.dtype)
        self.copy_to_device(out.ptr, host, constant)
        if host.dtype.kind in "iu" and 0 < host.size <= _EXTENT_ON_UPLOAD:
            # labels and indices: their range is known now, so a range check
            # later needs no copy back (index_extent)
            self._remember_extent(out, np.array([host.min(), host.max()]))
        return out

    # ------------------------------------------------------------ copies (counted)
    def copy_to_device(self, ptr: int, host: np.ndarray, constant: bool = False) -> None:
        """Host-to-device copy of ``host`` (C-contiguous) to address ``ptr``."""
        if self.capture is not None and not constant:
            self.capture.refuse(f"a host-to-device copy of {host.nbytes} bytes (shape {host.shape})")
        if host.nbytes:
            self.copies["htod"] += 1
            self.copies["htod_bytes"] += host.nbytes
            self.driver.htod(ptr, host)

    def copy_to_host(self, host: np.ndarray, ptr: int) -> None:
        """Device-to-host copy from address ``ptr`` into ``host`` (C-contiguous)."""
        if self.capture is not None:
            self.capture.refuse(f"a device-to-host copy of {host.nbytes} bytes (reading a value: "
                                f".item(), .numpy(), a range check)")
        if host.nbytes:
            self.copies["dtoh"] += 1
            self.copies["dtoh_bytes"] += host.nbytes
            self.driver.dtoh(host, ptr)

    def copy_on_device(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            self.copies["dtod"] += 1
            self.driver.dtod(dst, src, nbytes)

    def index_extent(self, index: DeviceArray) -> np.ndarray:
        """``[min, max]`` of an integer device array (empty when it is), on
        the host: what a range check needs. Read once per content: cached
        until the array's memory is written again (``Block.version``), so a
        training step that reuses its labels makes no device-to-host copy."""
        block = index._block
        key = (index.ptr, index.shape, index.dtype)
        hit = self._extents.get(key)
        if hit is not None and hit[0]() is block and hit[1] == block.version:
            return hit[2]
        host = index.get()
        extent = np.array([host.min(), host.max()]) if host.size else host.reshape(0)
        self._remember_extent(index, extent)
        return extent

    def share_extent(self, copy: DeviceArray, source: DeviceArray) -> None:
        """``copy`` holds ``source``'s values: its ``[min, max]``, when known
        for ``source``, is known for ``copy`` (no read back in a range check)."""
        block = source._block
        hit = self._extents.get((source.ptr, source.shape, source.dtype))
        if block is not None and hit is not None and hit[0]() is block and hit[1] == block.version:
            self._remember_extent(copy, hit[2])

    def _remember_extent(self, index: DeviceArray, extent: np.ndarray) -> None:
        block = index._block
        if block is not None:
            if len(self._extents) > 1024:
                self._extents.clear()
            self._extents[(index.ptr, index.shape, index.dtype)] = (weakref.ref(block), block.version, extent)

    @staticmethod
    def written(x: DeviceArray) -> None:
        """Mark ``x``'s memory as written in place (invalidates ``index_extent``)."""
        if x._block is not None:
            x._block.version += 1

    def memset0(self, x: DeviceArray) -> None:
        self.written(x)
        if x.nbytes:
            self.copies["memset"] += 1
            self.driver.memset0(x.ptr, x.nbytes)

    def memory_stats(self) -> dict:
        """The allocator's statistics and the copies made so far (see
        ``gradcore.cuda.memory_stats``)."""
        stats = self.pool.stats()
        stats.update(self.copies)
        stats["launches"] = self.launcher.launches
        stats["graph_launches"] = self.graph_launches
        return stats

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
        found = _kernels.kernel_names(src)
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
            fn = self.driver.function(module, name)
            mode, handle = self.driver.kernel_handle(fn)
            kinds, params = _kernels.parameters(src, name)
            k = self._kernels[key] = Kernel(name, fn, handle, mode, kinds, params)
        return k

    # launch(kernel, grid, block, *args, shared=0) and launch_n(kernel, n, *args)
    # (one thread per element of n, 1-D grid of 256-thread blocks; the standard
    # kernels are grid-stride loops) are the compiled Launcher's, bound in __init__

    def synchronize(self) -> None:
        if self.capture is not None:
            self.capture.refuse("a device synchronisation")
        self.driver.synchronize()

    def gemm(self, transa: bool, transb: bool, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
             beta, c, ldc, stride_c, batch, dtype) -> None:
        """cuBLAS ``<S|D>gemmStridedBatched`` (column-major), pointers as ints:
        through C function pointers where the driver has them (a GPU), else
        the driver's ``gemm`` (the emulator's NumPy shim)."""
        if self._bind_thread is not None:       # cuBLAS runs in the calling thread's context (made there, too)
            self._bind_thread()
        entry = self._blas_entry
        if entry is None:
            blas_entry = getattr(self.driver, "blas_entry", None)
            entry = self._blas_entry = blas_entry() if blas_entry is not None else False
        if entry:
            dtype = np.dtype(dtype)
            if dtype.kind != "f" or dtype.itemsize not in (4, 8):
                raise TypeError(f"cuBLAS GEMM: no kernel for {dtype}")
            tf32 = getattr(sys.modules.get("gradcore.cuda"), "allow_tf32_matmul", False) is True
            if tf32 != self._blas_tf32:     # the precision policy changed (docs/cuda.md, "Precision")
                self.driver.blas_tf32(tf32)
                self._blas_tf32 = tf32
            handle, sgemm, dgemm = entry
            double = dtype.itemsize == 8
            status = _launch.gemm(dgemm if double else sgemm, handle, transa, transb, m, n, k, alpha, a, lda,
                                  stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch, double)
            if status:
                from .blas import check_status
                check_status(status, f"{'D' if double else 'S'}gemmStridedBatched(m={m}, n={n}, k={k}, "
                                      f"batch={batch})")
            return
        self.driver.gemm(bool(transa), bool(transb), int(m), int(n), int(k), float(alpha), int(a), int(lda),
                         int(stride_a), int(b), int(ldb), int(stride_b), float(beta), int(c), int(ldc),
                         int(stride_c), int(batch), np.dtype(dtype))

    # ------------------------------------------------------------ array helpers (standard ops' kernels)
    def cast(self, x: DeviceArray, dtype) -> DeviceArray:
        return x if np.dtype(dtype) == x.dtype else standard_op("Cast")(dtype).cuda(self, x)

    def broadcast_to(self, x: DeviceArray, shape) -> DeviceArray:
        shape = tuple(shape)
        return x if x.shape == shape else standard_op("Broadcast")(shape).cuda(self, x)

    def transpose(self, x: DeviceArray, perm) -> DeviceArray:
        return standard_op("Transpose")(tuple(perm)).cuda(self, x)

    def reduce(self, mode: str, x: DeviceArray, axis=None, keepdims: bool = False) -> DeviceArray:
        if isinstance(axis, list):
            axis = tuple(axis)
        return standard_op("Reduce")(mode, axis, keepdims).cuda(self, x)

    def fill(self, x: DeviceArray, value) -> None:
        """Set every element of ``x`` to ``value`` (a kernel argument)."""
        self.written(x)
        if x.size:
            ctype = self.ctype(x.dtype)
            kernel = self.kernel(_FILL, ctype, source=fill_source(ctype))
            self.launch_n(kernel, x.size, x, x.dtype.type(value), x.size)

    def elementwise(self, mode: str, *operands, out: Optional[DeviceArray] = None) -> DeviceArray:
        """An ``Elemwise(mode)`` on device arrays and Python/NumPy scalars
        (scalars take the array's dtype, as NumPy's weak scalars do); with
        ``out``, written into it (which may be one of the operands, as
        ``a += b`` does; not a view overlapping one in another way)."""
        like = next(o for o in operands if isinstance(o, DeviceArray))
        arrays = [o if isinstance(o, DeviceArray) else self._operand(o, like.dtype) for o in operands]
        op = standard_op("Elemwise")(mode)
        return op.cuda(self, *arrays) if out is None else op.cuda(self, *arrays, out=out)

    def _operand(self, value, like_dtype) -> DeviceArray:
        host = _weak_scalar(value, like_dtype)
        return self.to_device(host) if host.ndim else self.scalar(host.item(), host.dtype)

    def scalar(self, value, dtype) -> DeviceArray:
        """A 0-d device array of ``value``, filled by a kernel and cached per
        (dtype, value): scalars in a step (a learning rate, a momentum) cost
        no host-to-device copy. Never written (results go to new arrays)."""
        dtype = np.dtype(dtype)
        key = (dtype, type(value), value)
        out = self._scalars.get(key)
        if out is None:
            if len(self._scalars) > 1024:
                self._scalars.clear()
            out = self._scalars[key] = self.full((), value, dtype)
        return out

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
        self.written(target)
        if value.nbytes and value.ptr != target.ptr:
            self.copy_on_device(target.ptr, value.ptr, value.nbytes)
        return target


class _Fill:
    """The kernel-cache identity of the fill kernel (not an op)."""

    def _name(self):
        return "fill"


_FILL = _Fill()


@functools.lru_cache(maxsize=None)      # built once per type: launchers ask on every call
def fill_source(ctype: str) -> str:
    """CUDA C of ``gc_fill_<type>(T* y, T value, long long n)``: y[:n] = value."""
    return _kernels.Kernel("fill", "T* y, T value, long long n", "y[i] = value;", over="n", index="i").source(ctype)


def _weak_scalar(value, dtype):
    value = np.asarray(value)
    if value.ndim:
        return value
    if value.dtype.kind == "f" and dtype.kind != "f":
        return value.astype(np.float64)
    return value.astype(dtype)


_UFUNC_MODES = {"add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "div", "divide": "div",
                "negative": "neg", "power": "pow", "maximum": "maximum", "minimum": "minimum",
                "sqrt": "sqrt", "exp": "exp", "log": "log", "abs": "abs", "absolute": "abs", "square": "square",
                "tanh": "tanh", "sin": "sin", "cos": "cos", "sign": "sign", "less": "lt", "greater": "gt",
                "equal": "eq", "not_equal": "ne", "less_equal": "le", "greater_equal": "ge",
                "floor": "floor", "ceil": "ceil"}


def open_driver(kind: Optional[str] = None):
    """The driver for ``kind``: "gpu" (PyCUDA), "emulator" (host), or None:
    ``$GRADCORE_CUDA`` ("gpu"/"emulator"), else a GPU."""
    import os
    kind = kind or os.environ.get("GRADCORE_CUDA", "").strip().lower() or "gpu"
    if kind == "gpu":
        return PyCudaDriver()
    if kind == "emulator":
        from .emulator import HostDriver
        return HostDriver()
    raise CudaUnavailable(f"GRADCORE_CUDA={kind!r}: expected 'gpu' or 'emulator'")


# ---------------------------------------------------------------- the process's backend
_backend: Optional[Backend] = None
_state_lock = threading.Lock()
_by_kind = {}       # one backend per driver kind: its loaded kernels survive a switch


def backend() -> Backend:
    """The process's CUDA backend, created on first use (a GPU through
    PyCUDA; ``$GRADCORE_CUDA=emulator`` selects the host emulator). Raises
    ``CudaUnavailable`` saying why when there is none."""
    global _backend
    if _backend is not None:
        return _backend
    with _state_lock:
        if _backend is None:
            _backend = Backend(open_driver())
    return _backend


def started() -> bool:
    """Whether the process's CUDA backend exists already (``backend()`` was
    called), without creating it."""
    return _backend is not None


def use(kind) -> Optional[Backend]:
    """Select the backend: "gpu", "emulator", a ``Backend`` instance, or
    None (forget it; the next use picks again). Returns the backend. Arrays
    made by an earlier backend keep working with that one."""
    global _backend
    with _state_lock:
        _backend = None
        # backward graphs and scalar constants compiled for the previous
        # backend hold its arrays: their owners drop them (they subscribe)
        events.publish("backend_changed")
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


_standard_ops = None        # name -> op-library object, installed by gradcore.ops


def install_standard_ops(lookup) -> None:
    """Hand the device layer the op library's kernels its array helpers use
    (``lookup(name)``, e.g. "Cast"); called by ``gradcore.ops`` at import."""
    global _standard_ops
    _standard_ops = lookup


def standard_op(name: str):
    """The op-library object ``name`` (see ``install_standard_ops``)."""
    if _standard_ops is None:
        raise RuntimeError(f"cuda: the op library is not installed (import gradcore first); needed: {name}")
    return _standard_ops(name)


def memory_stats() -> dict:
    """The CUDA backend's allocator statistics and copy counts, for debugging
    host round-trips and memory use::

        >>> import gradcore.cuda as gcuda                    # doctest: +SKIP
        >>> s = gcuda.memory_stats()                         # doctest: +SKIP
        >>> s["htod"], s["dtoh"], s["in_use_bytes"]          # doctest: +SKIP
        (3, 1, 4096)

    Keys: ``in_use_bytes``, ``cached_bytes``, ``peak_bytes``, ``driver_allocs``,
    ``driver_frees``, ``reuses`` (the caching allocator); ``htod``, ``dtoh``
    (host/device copies) with ``htod_bytes``, ``dtoh_bytes``; ``dtod`` and
    ``memset`` (on the device); ``launches`` (kernels launched)."""
    return backend().memory_stats()


def empty_cache() -> int:
    """Give the CUDA allocator's cached blocks back to the driver; the bytes freed.
    Example: ``gradcore.cuda.empty_cache()``."""
    return backend().pool.empty_cache()


def unavailable_reason() -> Optional[str]:
    """None when ``cuda`` works here, else why not."""
    try:
        backend()
        return None
    except CudaUnavailable as exc:
        return str(exc)


__all__ = ["Backend", "Dims", "DeviceArray", "Kernel", "pack_params", "backend", "use", "memory_stats", "empty_cache",
           "unavailable_reason", "CudaUnavailable", "CTYPES"]
