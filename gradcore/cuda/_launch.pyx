# cython: language_level=3, boundscheck=False, wraparound=False
"""The per-call part of the CUDA backend, compiled: kernel launches (argument
packing in the CUDA ABI's layout into a C buffer, then one call through a C
function pointer), the caching device allocator, and cuBLAS GEMMs through
function pointers. Contract: ``_launch.pxd``.

On a GPU the entry point is libcuda's ``cuLaunchKernel`` (its address found
once with dlopen/dlsym by the driver) and a kernel's handle is the
``CUfunction`` of PyCUDA's ``Function``; on the host emulator each kernel's
handle is the address of its compiled C launcher. Either way nothing of
PyCUDA's Python objects is touched per call.
"""
cimport cython
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset

import numpy as np


cdef class DeviceArrayBase:
    """The fields of a ``DeviceArray`` (gradcore/cuda/array.py), as C fields:
    read and written per call by the launch path."""


cdef object _array_type = None      # gradcore.cuda.array.DeviceArray


def set_array_type(array_type) -> None:
    """The DeviceArray class ``new_array`` makes (set by gradcore/cuda/array.py)."""
    global _array_type
    if not issubclass(array_type, DeviceArrayBase):
        raise TypeError(f"{array_type!r} does not derive from DeviceArrayBase")
    _array_type = array_type

cdef extern from *:
    """
    typedef int (*gc_cu_launch_t)(void* f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                  void* stream, void** params, void** extra);
    typedef void (*gc_host_launch_t)(const unsigned* grid, const unsigned* block, const char* params);
    typedef int (*gc_gemm_f_t)(void* h, int ta, int tb, int m, int n, int k, const float* alpha,
                               const float* a, int lda, long long sa, const float* b, int ldb, long long sb,
                               const float* beta, float* c, int ldc, long long sc, int batch);
    typedef int (*gc_gemm_d_t)(void* h, int ta, int tb, int m, int n, int k, const double* alpha,
                               const double* a, int lda, long long sa, const double* b, int ldb, long long sb,
                               const double* beta, double* c, int ldc, long long sc, int batch);
    """
    ctypedef int (*gc_cu_launch_t)(void* f, unsigned gx, unsigned gy, unsigned gz,
                                   unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                   void* stream, void** params, void** extra)
    ctypedef void (*gc_host_launch_t)(const unsigned* grid, const unsigned* block, const char* params)
    ctypedef int (*gc_gemm_f_t)(void* h, int ta, int tb, int m, int n, int k, const float* alpha,
                                const float* a, int lda, long long sa, const float* b, int ldb, long long sb,
                                const float* beta, float* c, int ldc, long long sc, int batch)
    ctypedef int (*gc_gemm_d_t)(void* h, int ta, int tb, int m, int n, int k, const double* alpha,
                                const double* a, int lda, long long sa, const double* b, int ldb, long long sb,
                                const double* beta, double* c, int ldc, long long sc, int batch)

DEF PARAM_BYTES = 4096
DEF THREADS = 256

# numpy scalar type -> (size, alignment, kind): 'f' float, 'd' double, 'i' signed, 'u' unsigned, 'b' bool
cdef dict _SCALARS = {}
for _t in (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
           np.uint64, np.bool_):
    _d = np.dtype(_t)
    _SCALARS[_t] = (_d.itemsize, _d.alignment, "f" if _t is np.float32 else "d" if _t is np.float64
                    else "b" if _t is np.bool_ else _d.kind)

cdef object _Dims = None        # runtime.Dims (a ctypes Structure), set by runtime
cdef Py_ssize_t _dims_size = 0, _dims_align = 8


def set_dims_type(dims_type, Py_ssize_t size, Py_ssize_t align):
    """Tell the packer the ``gc_dims`` struct type (gradcore.cuda.runtime.Dims)."""
    global _Dims, _dims_size, _dims_align
    _Dims, _dims_size, _dims_align = dims_type, size, align


cdef inline Py_ssize_t _put(char* buf, Py_ssize_t off, const void* value, Py_ssize_t size, Py_ssize_t align):
    """Write ``size`` bytes of ``value`` (NULL: zeros) at ``off`` rounded up to
    ``align``, the padding zeroed (deterministic buffers); the offset after
    it, or -1 when the buffer is full."""
    cdef Py_ssize_t at = (off + align - 1) // align * align
    if at + size > PARAM_BYTES:
        return -1
    memset(buf + off, 0, at - off)
    if value == NULL:
        memset(buf + at, 0, size)
    else:
        memcpy(buf + at, value, size)
    return at + size


cdef Py_ssize_t _pack_into(char* buf, tuple args) except -2:
    """Write ``args`` into ``buf`` as the CUDA ABI lays out kernel parameters;
    the bytes written."""
    cdef Py_ssize_t off = 0, i = 0, size, align
    cdef unsigned long long p
    cdef long long q
    cdef float f
    cdef double d
    cdef object t, spec
    cdef bytes raw
    for a in args:
        t = type(a)
        if isinstance(a, DeviceArrayBase):
            p = (<DeviceArrayBase>a).ptr
            if p == 0 and (<DeviceArrayBase>a).size:
                raise ValueError(f"a shape-only array (no device memory) of shape {a.shape} cannot be read by a kernel")
            off = _put(buf, off, &p, 8, 8)
        elif t is int:
            q = a
            off = _put(buf, off, &q, 8, 8)
        elif a is None:
            off = _put(buf, off, NULL, 8, 8)
        elif t is _Dims:
            raw = bytes(a)
            off = _put(buf, off, <char*>raw, _dims_size, _dims_align)
        else:
            spec = _SCALARS.get(t)
            if spec is None:
                if t is bool:
                    raise TypeError(f"kernel argument {i}: pass np.bool_({a}) (a bool is ambiguous)")
                if t is float:
                    raise TypeError(f"kernel argument {i}: pass np.float32({a}) or np.float64({a}), the kernel's C type")
                raise TypeError(f"kernel argument {i}: cannot pass a {type(a).__name__} to a kernel")
            size, align, kind = spec
            if kind == "f":
                f = a
                off = _put(buf, off, &f, 4, align)
            elif kind == "d":
                d = a
                off = _put(buf, off, &d, 8, align)
            else:
                q = int(a)
                off = _put(buf, off, &q, size, align)     # little-endian: the low bytes
        if off < 0:
            raise ValueError(f"kernel arguments take more than {PARAM_BYTES} bytes")
        i += 1
    return off


def pack_params(args) -> bytes:
    """Kernel arguments as one buffer in the CUDA ABI's layout: each
    parameter at an offset aligned to its own alignment, in order."""
    cdef char buf[PARAM_BYTES]
    cdef Py_ssize_t n = _pack_into(buf, tuple(args))
    return buf[:n]


cdef class Kernel:
    """A loaded kernel: its C handle and how to launch it (see _launch.pxd)."""

    def __init__(self, name, fn, uintptr_t handle, str mode):
        if mode not in ("cuda", "host", "python"):
            raise ValueError(f"kernel {name}: launch mode {mode!r}, expected 'cuda', 'host' or 'python'")
        if handle == 0 and mode != "python":
            raise ValueError(f"kernel {name}: a null handle")
        self.name, self.fn, self.handle = name, fn, <void*>handle
        self.mode = MODE_CUDA if mode == "cuda" else MODE_HOST if mode == "host" else MODE_PYTHON

    @property
    def launch_mode(self) -> str:
        """"cuda" (cuLaunchKernel), "host" (the emulator's C launcher) or "python" (the driver's launch)."""
        return ("cuda", "host", "python")[<int>self.mode]

    def __repr__(self):
        return f"Kernel({self.name}, {self.launch_mode})"


cdef void _keep_blocks(list keep, MemoryPool own_pool, tuple args):
    # every block but the capturing graph's own: that pool lends its blocks to
    # nobody else, so they may be freed and reused within the capture; any
    # other (the main pool's, another graph's) must outlive this graph
    cdef object block
    for a in args:
        if isinstance(a, DeviceArrayBase):
            block = (<DeviceArrayBase>a)._block
            if type(block) is Block and (<Block>block).pool is not own_pool:
                keep.append(block)


cdef class Launcher:
    """Launches ``Kernel``s (see _launch.pxd). ``cu_launch_address`` is the
    address of ``cuLaunchKernel`` (0 on the host emulator)."""

    def __init__(self, uintptr_t cu_launch_address=0, trace=None, python_launch=None):
        self.cu_launch = <void*>cu_launch_address
        self.trace = trace
        self.python_launch = python_launch
        self.dry_run = False
        self.launches = 0
        self.capture, self.keep, self.stream = None, None, 0

    cdef int submit(self, Kernel k, unsigned* g, unsigned* b, Py_ssize_t size, unsigned shared) except -1:
        cdef size_t nbytes = size
        cdef void* extra[5]
        cdef int status
        if b[0] * b[1] * b[2] > 1024 or b[2] > 64 or b[0] < 1 or b[1] < 1 or b[2] < 1:
            raise RuntimeError(f"{k.name}: invalid block ({b[0]}, {b[1]}, {b[2]}) (at most 1024 threads, z at most 64)")
        if not (1 <= g[0] < 2147483648u and 1 <= g[1] <= 65535 and 1 <= g[2] <= 65535):
            raise RuntimeError(f"{k.name}: invalid grid ({g[0]}, {g[1]}, {g[2]})")
        self.launches += 1
        if self.trace is not None:
            self.trace.append(k.name)
        if self.dry_run:
            return 0
        if self.capture is not None:
            self.capture(k, (g[0], g[1], g[2]), (b[0], b[1], b[2]), self.buf[:size], shared)
            return 0
        if k.mode == MODE_HOST:
            (<gc_host_launch_t>k.handle)(g, b, self.buf)
            return 0
        if k.mode == MODE_PYTHON:
            self.python_launch(k.fn, (g[0], g[1], g[2]), (b[0], b[1], b[2]), self.buf[:size], shared)
            return 0
        if self.cu_launch == NULL:
            raise RuntimeError(f"{k.name}: no cuLaunchKernel entry point for a CUDA kernel")
        extra[0] = <void*>1              # CU_LAUNCH_PARAM_BUFFER_POINTER
        extra[1] = <void*>self.buf
        extra[2] = <void*>2              # CU_LAUNCH_PARAM_BUFFER_SIZE
        extra[3] = <void*>&nbytes
        extra[4] = <void*>0              # CU_LAUNCH_PARAM_END
        status = (<gc_cu_launch_t>self.cu_launch)(k.handle, g[0], g[1], g[2], b[0], b[1], b[2], shared,
                                                  <void*>self.stream, NULL, extra)
        if status != 0:
            raise RuntimeError(f"{k.name}: cuLaunchKernel failed (CUresult {status}) with grid "
                               f"({g[0]}, {g[1]}, {g[2]}), block ({b[0]}, {b[1]}, {b[2]})")
        return 0

    def launch(self, Kernel kernel, grid, block, *args, unsigned shared=0):
        """Launch ``kernel`` on ``grid`` x ``block`` (tuples of 1 to 3 ints)."""
        cdef unsigned g[3]
        cdef unsigned b[3]
        cdef Py_ssize_t i, n
        g[0] = g[1] = g[2] = b[0] = b[1] = b[2] = 1
        n = len(grid)
        if n > 3 or len(block) > 3:
            raise ValueError(f"{kernel.name}: grid {grid} and block {block} take at most 3 dimensions")
        for i in range(n):
            g[i] = grid[i]
        for i in range(len(block)):
            b[i] = block[i]
        size = _pack_into(self.buf, args)
        if self.keep is not None:
            _keep_blocks(self.keep, self.own_pool, args)
        self.submit(kernel, g, b, size, shared)

    def launch_n(self, Kernel kernel, long long n, *args):
        """Launch with one thread per element of ``n`` (1-D grid of 256-thread
        blocks; the standard kernels are grid-stride loops)."""
        cdef unsigned g[3]
        cdef unsigned b[3]
        cdef long long blocks
        if n <= 0:
            return
        blocks = (n + THREADS - 1) // THREADS
        g[0] = <unsigned>(blocks if blocks < 2147483647 else 2147483647)
        g[1] = g[2] = b[1] = b[2] = 1
        b[0] = THREADS
        size = _pack_into(self.buf, args)
        if self.keep is not None:
            _keep_blocks(self.keep, self.own_pool, args)
        self.submit(kernel, g, b, size, 0)


# ---------------------------------------------------------------- the caching allocator
DEF SMALL = 1 << 20


cpdef Py_ssize_t size_class(Py_ssize_t nbytes):
    """The allocation size serving a request of ``nbytes``: multiples of 512
    bytes below 1 MiB, then 8 steps per power of two (at most 12.5% slack)."""
    cdef Py_ssize_t step
    if nbytes <= 0:
        return 512
    if nbytes < SMALL:
        return (nbytes + 511) & ~511
    step = (<Py_ssize_t>1) << ((<object>nbytes).bit_length() - 4)
    return (nbytes + step - 1) // step * step


@cython.no_gc_clear      # its pool must still be there when it is deallocated
@cython.freelist(256)    # one per array: recycled without the allocator
cdef class Block:
    """A device allocation lent by the pool; back to the pool's free list
    when the last reference (an array, its views) goes."""

    def __int__(self):
        return self.ptr

    def __dealloc__(self):
        if self.pool is not None:
            self.pool.give_back(self.ptr, self.size)
            self.pool = None


@cython.no_gc_clear
cdef class MemoryPool:
    """Device blocks cached per size class. Every kernel and copy of the
    backend runs on the one (default) stream, so a block given back on the
    host may be handed out again at once: work queued on it before is
    ordered before any later use (stream-ordered reuse). Free lists hold
    addresses only; the driver's allocation objects stay in one table."""

    def __init__(self, driver):
        self.driver = driver
        self.free_lists = {}
        self.allocations = {}
        self.in_use_bytes = self.cached_bytes = self.peak_bytes = 0
        self.driver_allocs = self.driver_frees = self.reuses = 0

    cpdef Block malloc(self, Py_ssize_t nbytes):
        """A block of at least ``nbytes``: a cached one of its size class,
        else a new one from the driver (on out-of-memory, the cache is
        released and the allocation tried once more)."""
        cdef Py_ssize_t size
        cdef list bucket
        cdef Block block
        if self.redirect is not None:
            return self.redirect.malloc(nbytes)
        size = size_class(nbytes)
        bucket = self.free_lists.get(size)
        block = Block.__new__(Block)
        if bucket:
            block.ptr = bucket.pop()
            self.cached_bytes -= size
            self.reuses += 1
        else:
            try:
                alloc = self.driver.alloc(size)
            except MemoryError:
                self.empty_cache()
                alloc = self.driver.alloc(size)      # a second failure propagates
            block.ptr = int(alloc)
            self.allocations[block.ptr] = alloc
            self.driver_allocs += 1
        block.size = size
        block.pool = self
        self.in_use_bytes += size
        if self.in_use_bytes > self.peak_bytes:
            self.peak_bytes = self.in_use_bytes
        return block

    cdef void give_back(self, unsigned long long ptr, Py_ssize_t size):
        if self.held is not None:
            self.held.append((ptr, size))
            self.in_use_bytes -= size
            return
        bucket = self.free_lists.get(size)
        if bucket is None:
            self.free_lists[size] = [ptr]
        else:
            (<list>bucket).append(ptr)
        self.in_use_bytes -= size
        self.cached_bytes += size

    def release_held(self, held) -> None:
        """Put blocks a CUDA graph held ((address, size) pairs, see ``held``)
        back on the free lists: the graph that may read them is gone."""
        for ptr, size in held:
            self.in_use_bytes += size
            self.give_back(ptr, size)

    def empty_cache(self) -> int:
        """Return every cached block to the driver; the bytes freed."""
        free, self.free_lists = self.free_lists, {}
        freed, self.cached_bytes = self.cached_bytes, 0
        for ptrs in free.values():
            for ptr in ptrs:
                self.driver.free(self.allocations.pop(ptr))
                self.driver_frees += 1
        return freed

    def stats(self) -> dict:
        """Bytes in use / cached / at peak, driver allocations and frees, reuses."""
        return {"in_use_bytes": self.in_use_bytes, "cached_bytes": self.cached_bytes,
                "peak_bytes": self.peak_bytes, "driver_allocs": self.driver_allocs,
                "driver_frees": self.driver_frees, "reuses": self.reuses}


cdef object _ndarray_dtype = np.dtype
cdef object _dtype_meta = type(type(np.dtype("float32")))     # the class of every dtype class


def new_array(MemoryPool pool, backend, shape, dtype):
    """An uninitialised ``DeviceArray`` of ``shape``/``dtype`` from ``pool``
    (``DeviceArray.__init__``'s work, done here: it runs for every result)."""
    cdef Block block
    cdef Py_ssize_t size = 1, nbytes, itemsize
    if type(shape) is not tuple:
        shape = tuple(shape)
    if type(type(dtype)) is not _dtype_meta:     # not a dtype object (a str, a scalar type)
        dtype = _ndarray_dtype(dtype)
    itemsize = dtype.itemsize
    for s in shape:
        size *= <Py_ssize_t>s
    nbytes = size * itemsize
    cdef DeviceArrayBase out = _array_type.__new__(_array_type)
    out.backend = backend
    out.shape = shape
    out.dtype = dtype
    out.ndim = len(shape)
    out.size = size
    out.nbytes = nbytes
    if nbytes:
        block = pool.malloc(nbytes)
        out._block = block
        out.ptr = block.ptr
    else:
        out._block = None
        out.ptr = 0
    return out


# ---------------------------------------------------------------- cuBLAS
def gemm(uintptr_t fn, uintptr_t handle, bint transa, bint transb, int m, int n, int k, double alpha,
         uintptr_t a, int lda, long long stride_a, uintptr_t b, int ldb, long long stride_b, double beta,
         uintptr_t c, int ldc, long long stride_c, int batch, bint double_precision):
    """``cublas<S|D>gemmStridedBatched`` at address ``fn`` on cuBLAS handle
    ``handle``; the cublasStatus_t."""
    cdef float fa = alpha, fb = beta
    if double_precision:
        return (<gc_gemm_d_t><void*>fn)(<void*>handle, transa, transb, m, n, k, &alpha, <const double*>a, lda,
                                        stride_a, <const double*>b, ldb, stride_b, &beta, <double*>c, ldc,
                                        stride_c, batch)
    return (<gc_gemm_f_t><void*>fn)(<void*>handle, transa, transb, m, n, k, &fa, <const float*>a, lda,
                                    stride_a, <const float*>b, ldb, stride_b, &fb, <float*>c, ldc,
                                    stride_c, batch)


# ---------------------------------------------------------------- the elementwise launcher, compiled
cdef class ElementwiseLauncher:
    """``Elemwise.cuda`` (ops/elemwise.py) for one op on one backend, with
    its common case compiled: inputs already of the kernel's type and shape
    (no cast, no broadcast copy). The op's own ``_cuda_plan`` decides, once
    per signature of input shapes and dtypes; any other case runs the op's
    Python launcher. Kernel arguments as the op's launcher passes them:
    ``(x, x.size)`` per input, then the output and its size."""

    cdef object op, backend, fallback
    cdef dict plans
    cdef Launcher launcher
    cdef MemoryPool pool

    def __init__(self, op, backend):
        self.op, self.backend, self.fallback = op, backend, op.cuda
        self.plans = {}
        self.launcher, self.pool = backend.launcher, backend.pool

    def __call__(self, *xs):
        cdef Py_ssize_t n = len(xs)
        cdef object plan, key
        cdef DeviceArrayBase a, b
        if n == 1:
            a = xs[0]
            key = (a.shape, a.dtype)
        elif n == 2:
            a, b = xs[0], xs[1]
            key = (a.shape, a.dtype, b.shape, b.dtype)
        else:
            key = tuple([(x.shape, x.dtype) for x in xs])
        plan = self.plans.get(key)
        if plan is None:
            plan = self._plan(xs, key)
        if plan is False:
            return self.fallback(self.backend, *xs)
        out_shape, out_dtype, size, kernel = <tuple>plan
        y = new_array(self.pool, self.backend, out_shape, out_dtype)
        if size:
            if n == 1:
                self.launcher.launch_n(kernel, size, xs[0], xs[0].size, y, size)
            elif n == 2:
                self.launcher.launch_n(kernel, size, xs[0], xs[0].size, xs[1], xs[1].size, y, size)
            else:
                args = []
                for x in xs:
                    args += [x, x.size]
                self.launcher.launch_n(kernel, size, *args, y, size)
        return y

    def _plan(self, xs, key):
        out_shape, out_dtype, size, casts, kernel, check_pow = self.op._cuda_plan(self.backend, xs)
        fast = not check_pow and all(dtype is None and not expand for dtype, expand in casts)
        if len(self.plans) > 256:
            self.plans.clear()
        plan = self.plans[key] = (out_shape, out_dtype, size, kernel) if fast else False
        return plan


# ---------------------------------------------------------------- fused backward launches, compiled
cdef class FusedRunner:
    """The raw backward of an all-elementwise backward graph on cuda: ONE
    launch of its fused kernel (``gradcore.cuda.fusion.fused_runner`` builds
    it and documents the layout). Called as ``runner(saved, grads)``."""

    cdef tuple fetch                    # per parameter: (from the saved values?, index or None)
    cdef tuple param_dtypes, out_dtypes, grad_order
    cdef bint single
    cdef object op, ctype, name, source
    cdef dict compiled                  # backend -> Kernel
    cdef public object fused_kernel

    def __init__(self, op, ctype, name, source, fetch, param_dtypes, out_dtypes, grad_order, bint single):
        self.op, self.ctype, self.name, self.source = op, ctype, name, source
        self.fetch, self.param_dtypes, self.out_dtypes = tuple(fetch), tuple(param_dtypes), tuple(out_dtypes)
        self.grad_order, self.single = tuple(grad_order), single
        self.compiled = {}

    def __call__(self, s, g):
        cdef list params = []
        cdef Py_ssize_t j
        cdef bint same = True
        for from_saved, i in self.fetch:
            src = s if from_saved else g
            params.append(src if i is None else src[i])
        be = params[0].backend
        k = self.compiled.get(be)
        if k is None:
            k = self.compiled[be] = be.kernel(self.op, self.ctype, name=self.name, source=self.source)
        shape = params[0].shape
        for p in params:
            if p.shape != shape:
                same = False
                break
        if same:
            for j in range(len(params)):
                if params[j].dtype != self.param_dtypes[j]:
                    params[j] = be.cast(params[j], self.param_dtypes[j])
        else:
            shape = tuple(np.broadcast_shapes(*[p.shape for p in params]))
            params = [be.broadcast_to(be.cast(p, dt), shape) for p, dt in zip(params, self.param_dtypes)]
        pool = be.pool
        outs = [new_array(pool, be, shape, dt) for dt in self.out_dtypes]
        size = outs[0].size if outs else 0
        be.launch_n(k, size, *params, *outs, size)
        if self.single:
            j0 = self.grad_order[0]
            return None if j0 is None else outs[j0]
        return tuple([None if j_ is None else outs[j_] for j_ in self.grad_order])


# ---------------------------------------------------------------- the core's kernel lookup, compiled
cdef class LauncherTable:
    """``op -> kernel`` for the core's dispatch (``gradcore.devices.kernel_for``'s
    compiled front): on cpu the op's ``cpu`` kernel; on cuda the launcher
    cached per op, made by ``make(op)`` on a miss."""

    cdef dict table
    cdef object make

    def __init__(self, make):
        self.table, self.make = {}, make

    def __call__(self, op, device):
        if device == "cpu":
            return op.cpu
        fn = self.table.get(op)
        if fn is None:
            fn = self.make(op)
            if len(self.table) > 4096:
                self.table.clear()
            self.table[op] = fn
        return fn

    def clear(self) -> None:
        """Forget every launcher (the backend changed)."""
        self.table.clear()
