# Cython directives: setup.py, for every compiled module at once.
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
from cpython.number cimport PyNumber_Index
from libc.stdint cimport uintptr_t
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memcpy, memset

import numpy as np


cdef class DeviceArrayBase:
    """The fields of a ``DeviceArray`` (gradcore/cuda/array.py), as C fields:
    read and written per call by the launch path."""


cdef object _array_type = None      # gradcore.cuda.array.DeviceArray
cdef tuple _no_args = ()

cdef extern from *:
    """
    /* an instance of ``type`` through its tp_new slot (no lookup of __new__,
       no argument parsing): DeviceArray defines no __new__ of its own */
    static PyObject* gc_new_instance(PyObject* type, PyObject* args) {
        return ((PyTypeObject*)type)->tp_new((PyTypeObject*)type, args, NULL);
    }
    """
    object gc_new_instance(object type, object args)


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

cdef extern from *:
    """
    /* per thread: the Launcher (by its id) whose driver made its context current here; a new
       thread starts at 0 (a thread id can be reused by the next thread, this cannot) */
    static __thread unsigned long long gc_bound_launcher = 0;
    static unsigned long long gc_thread_bound_to(void) { return gc_bound_launcher; }
    static void gc_set_thread_bound_to(unsigned long long id) { gc_bound_launcher = id; }
    """
    unsigned long long gc_thread_bound_to()
    void gc_set_thread_bound_to(unsigned long long id)

cdef unsigned long long _launcher_ids = 0

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


cdef inline Py_ssize_t _put_array(char* buf, Py_ssize_t off, DeviceArrayBase a) except -2:
    """An array's device address at ``off`` (8-aligned), the offset after it."""
    cdef unsigned long long p = a.ptr
    if p == 0 and a.size:
        raise ValueError(f"a shape-only array (no device memory) of shape {a.shape} cannot be read by a kernel")
    return _put(buf, off, &p, 8, 8)


cdef inline Py_ssize_t _put_i64(char* buf, Py_ssize_t off, long long value):
    return _put(buf, off, &value, 8, 8)


cdef object _argument_error(Kernel k, tuple args, Py_ssize_t i, str problem):
    params = [p.strip() for p in str(k.params).split(",")]
    if i < 0:
        return TypeError(f"kernel {k.name}({k.params}) takes {len(params)} arguments, got {len(args)}")
    return TypeError(f"kernel {k.name}({k.params}): argument {i} ({params[i]}) {problem}")


cdef Py_ssize_t _pack_into(char* buf, tuple args, Kernel k=None) except -2:
    """Write ``args`` into ``buf`` as the CUDA ABI lays out kernel parameters;
    the bytes written. With a kernel whose parameters are known (``k.kinds``)
    each argument is checked against its parameter and a Python int takes
    the parameter's size: a missing argument or a float32 for a double is an
    error naming the kernel, not garbage read on the device."""
    cdef Py_ssize_t off = 0, i = 0, size, align
    cdef long long q
    cdef float f
    cdef double d
    cdef object t, spec
    cdef bytes raw
    cdef const char* kinds = NULL
    cdef char want = 63                # "?": anything
    if k is not None and k.kinds is not None:
        if len(args) != len(k.kinds):
            raise _argument_error(k, args, -1, "")
        kinds = k.kinds
    for a in args:
        t = type(a)
        if kinds != NULL:
            want = kinds[i]
        if isinstance(a, DeviceArrayBase):
            if want != 112 and want != 63:       # "p"
                raise _argument_error(k, args, i, "is a scalar parameter, got a device array")
            off = _put_array(buf, off, <DeviceArrayBase>a)
        elif t is int:
            if want == 112 or want == 102 or want == 100:      # "p", "f", "d"
                raise _argument_error(k, args, i, f"takes no Python int: pass {'a device array' if want == 112 else 'x.dtype.type(value), the kernel element type'}")
            size = 8 if want == 63 else want - 48
            q = a
            if size < 8 and not (-(1 << (8 * size - 1)) <= q < (1 << (8 * size))):
                raise _argument_error(k, args, i, f"does not hold {a}")
            off = _put(buf, off, &q, size, size)      # little-endian: the low bytes
        elif a is None:
            if want != 112 and want != 63:
                raise _argument_error(k, args, i, "is a scalar parameter, got None")
            off = _put(buf, off, NULL, 8, 8)
        elif t is _Dims:
            raw = bytes(a)
            off = _put(buf, off, <char*>raw, _dims_size, _dims_align)
        else:
            spec = _SCALARS.get(t)
            if spec is None:
                if t is bool:
                    problem = f"takes no Python bool: pass np.bool_({a}) (a bool is ambiguous)"
                elif t is float:
                    problem = (f"takes no Python float: pass np.float32({a}) or np.float64({a}), the "
                               f"parameter's C type (x.dtype.type(value) for an element-type parameter)")
                else:
                    problem = f"cannot take a {type(a).__name__}"
                if kinds != NULL:
                    raise _argument_error(k, args, i, problem)
                raise TypeError(f"kernel argument {i} {problem}")
            size, align, kind = spec
            if want != 63 and want != (102 if kind == "f" else 100 if kind == "d" else 48 + size):
                raise _argument_error(k, args, i, f"got a {np.dtype(t).name}: pass the parameter's own type "
                                                  f"(x.dtype.type(value) for an element-type parameter)")
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

    def __init__(self, name, fn, uintptr_t handle, str mode, bytes kinds=None, params=None):
        """``kinds``/``params``: what ``kernels.parameters`` says of its
        parameters (None: launches are not checked)."""
        self.kinds, self.params = kinds, params
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
    address of ``cuLaunchKernel`` (0 on the host emulator); ``bind_thread``
    (the GPU driver's) makes its context current in a thread launching for
    the first time."""

    def __init__(self, uintptr_t cu_launch_address=0, trace=None, python_launch=None, bind_thread=None):
        self.cu_launch = <void*>cu_launch_address
        self.trace = trace
        self.python_launch = python_launch
        global _launcher_ids
        self.bind_thread = bind_thread
        _launcher_ids += 1
        self.launcher_id = _launcher_ids
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
        if self.bind_thread is not None and gc_thread_bound_to() != self.launcher_id:
            # CUDA's current context is per thread: a launch from a thread without
            # it fails (CUDA_ERROR_INVALID_CONTEXT); one compare per launch
            self.bind_thread()
            gc_set_thread_bound_to(self.launcher_id)
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
        try:
            n = len(grid)
            if n > 3 or len(block) > 3:
                raise ValueError(f"{kernel.name}: grid {grid} and block {block} take at most 3 dimensions")
            # PyNumber_Index: a float size ((n + 127) / 128) is refused, not truncated
            for i in range(n):
                g[i] = PyNumber_Index(grid[i])
            for i in range(len(block)):
                b[i] = PyNumber_Index(block[i])
        except (TypeError, OverflowError) as exc:
            # an int for a tuple, a negative size: say what a launch takes
            raise ValueError(f"{kernel.name}: the grid and the block are tuples of 1 to 3 non-negative ints "
                             f"(e.g. grid=(blocks,), block=(threads,)), got grid={grid!r}, block={block!r} "
                             f"({exc})") from None
        size = _pack_into(self.buf, args, kernel)
        if self.keep is not None:
            _keep_blocks(self.keep, self.own_pool, args)
        self.submit(kernel, g, b, size, shared)

    def launch_n(self, Kernel kernel, long long n, *args):
        """Launch with one thread per element of ``n`` (1-D grid of 256-thread
        blocks; the standard kernels are grid-stride loops)."""
        if n <= 0:
            return
        size = _pack_into(self.buf, args, kernel)
        if self.keep is not None:
            _keep_blocks(self.keep, self.own_pool, args)
        self.submit_n(kernel, n, size)

    cdef int submit_n(self, Kernel kernel, long long n, Py_ssize_t size) except -1:
        # the parameters are in ``buf`` already (``size`` bytes); n > 0
        cdef unsigned g[3]
        cdef unsigned b[3]
        cdef long long blocks = (n + THREADS - 1) // THREADS
        g[0] = <unsigned>(blocks if blocks < 2147483647 else 2147483647)
        g[1] = g[2] = b[1] = b[2] = 1
        b[0] = THREADS
        return self.submit(kernel, g, b, size, 0)


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


DEF SMALL_CLASSES = SMALL // 512 + 1   # the classes 512, 1024, ..., 1 MiB: index size // 512


cdef bint _push(AddressStack* stack, unsigned long long ptr) noexcept:
    """Put ``ptr`` on ``stack``; False when the host is out of memory."""
    cdef Py_ssize_t cap
    cdef unsigned long long* grown
    if stack.n == stack.cap:
        cap = stack.cap * 2 if stack.cap else 8
        grown = <unsigned long long*>realloc(stack.items, cap * sizeof(unsigned long long))
        if grown == NULL:
            return False
        stack.items, stack.cap = grown, cap
    stack.items[stack.n] = ptr
    stack.n += 1
    return True


@cython.no_gc_clear
cdef class MemoryPool:
    """Device blocks cached per size class. Every kernel and copy of the
    backend runs on the one (default) stream, so a block given back on the
    host may be handed out again at once: work queued on it before is
    ordered before any later use (stream-ordered reuse). Free lists hold
    addresses only, in C stacks for the classes up to 1 MiB (no Python
    object per allocation or release) and Python lists above; the driver's
    allocation objects stay in one table."""

    def __cinit__(self):
        self.small = <AddressStack*>calloc(SMALL_CLASSES, sizeof(AddressStack))
        if self.small == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.small != NULL:
            for i in range(SMALL_CLASSES):
                free(self.small[i].items)
            free(self.small)
            self.small = NULL

    def __init__(self, driver):
        self.driver = driver
        self.free_lists = {}
        self.allocations = {}
        self.in_use_bytes = self.cached_bytes = self.peak_bytes = 0
        self.reserved_bytes = self.peak_reserved_bytes = 0
        self.driver_allocs = self.driver_frees = self.reuses = 0

    cpdef Block malloc(self, Py_ssize_t nbytes):
        """A block of at least ``nbytes``: a cached one of its size class,
        else a new one from the driver (on out-of-memory, the cache is
        released and the allocation tried once more)."""
        cdef Py_ssize_t size
        cdef AddressStack* stack
        cdef list bucket
        cdef Block block
        cdef bint cached = False
        if self.redirect is not None:
            return self.redirect.malloc(nbytes)
        size = size_class(nbytes)
        block = Block.__new__(Block)
        if size <= SMALL:
            stack = &self.small[size >> 9]
            if stack.n:
                stack.n -= 1
                block.ptr = stack.items[stack.n]
                cached = True
        else:
            bucket = self.free_lists.get(size)
            if bucket:
                block.ptr = bucket.pop()
                cached = True
        if cached:
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
            self.reserved_bytes += size
            if self.reserved_bytes > self.peak_reserved_bytes:
                self.peak_reserved_bytes = self.reserved_bytes
        block.size = size
        block.pool = self
        self.in_use_bytes += size
        if self.in_use_bytes > self.peak_bytes:
            self.peak_bytes = self.in_use_bytes
        return block

    cdef void give_back(self, unsigned long long ptr, Py_ssize_t size):
        self.in_use_bytes -= size
        if self.held is not None:
            # a CUDA graph under capture may still read it: held until the graph goes
            self.held.append((ptr, size))
            return
        self.cached_bytes += size
        if size <= SMALL and _push(&self.small[size >> 9], ptr):
            return
        bucket = self.free_lists.get(size)
        if bucket is None:
            self.free_lists[size] = [ptr]
        else:
            (<list>bucket).append(ptr)

    def release_held(self, held) -> None:
        """Put blocks a CUDA graph held ((address, size) pairs, see ``held``)
        back on the free lists: the graph that may read them is gone."""
        for ptr, size in held:
            self.in_use_bytes += size
            self.give_back(ptr, size)

    def empty_cache(self) -> int:
        """Return every cached block to the driver; the bytes freed."""
        cdef Py_ssize_t i
        cdef AddressStack* stack
        freed, self.cached_bytes = self.cached_bytes, 0
        self.reserved_bytes -= freed
        free_lists, self.free_lists = self.free_lists, {}
        for i in range(SMALL_CLASSES):
            stack = &self.small[i]
            while stack.n:
                stack.n -= 1
                self.driver.free(self.allocations.pop(stack.items[stack.n]))
                self.driver_frees += 1
        for ptrs in free_lists.values():
            for ptr in ptrs:
                self.driver.free(self.allocations.pop(ptr))
                self.driver_frees += 1
        return freed

    def reset_peaks(self) -> None:
        """Start ``peak_bytes`` and ``peak_reserved_bytes`` again from now."""
        self.peak_bytes = self.in_use_bytes
        self.peak_reserved_bytes = self.reserved_bytes

    def stats(self) -> dict:
        """Bytes in use / cached / at peak, taken from the driver (reserved) and
        its peak, driver allocations and frees, reuses."""
        return {"in_use_bytes": self.in_use_bytes, "cached_bytes": self.cached_bytes,
                "peak_bytes": self.peak_bytes, "reserved_bytes": self.reserved_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes, "driver_allocs": self.driver_allocs,
                "driver_frees": self.driver_frees, "reuses": self.reuses}


cdef object _ndarray_dtype = np.dtype
cdef object _dtype_meta = type(type(np.dtype("float32")))     # the class of every dtype class


def new_array(MemoryPool pool, backend, shape, dtype):
    """An uninitialised ``DeviceArray`` of ``shape``/``dtype`` from ``pool``
    (``DeviceArray.__init__``'s work, done here: it runs for every result)."""
    cdef Py_ssize_t size = 1
    if type(shape) is not tuple:
        shape = tuple(shape)
    if type(type(dtype)) is not _dtype_meta:     # not a dtype object (a str, a scalar type)
        dtype = _ndarray_dtype(dtype)
    for s in shape:
        size *= <Py_ssize_t>s
    return _new_array(pool, backend, <tuple>shape, dtype, size, size * <Py_ssize_t>dtype.itemsize)


cdef DeviceArrayBase _new_array(MemoryPool pool, object backend, tuple shape, object dtype,
                                Py_ssize_t size, Py_ssize_t nbytes):
    # the compiled launchers' results: shape, dtype, size and bytes known already
    cdef Block block
    cdef DeviceArrayBase out
    if _array_type is None:
        raise RuntimeError("gradcore.cuda.array is not imported: no DeviceArray type to make")
    out = <DeviceArrayBase>gc_new_instance(_array_type, _no_args)
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
@cython.final
cdef class _ElementwisePlan:
    # what ElementwiseLauncher does for one signature of input shapes and dtypes
    cdef tuple out_shape
    cdef object out_dtype
    cdef Py_ssize_t size, nbytes
    cdef Kernel kernel                  # None: the op's own launcher runs (casts, broadcasts, pow checks)


cdef class ElementwiseLauncher:
    """``Elemwise.cuda`` (ops/elemwise.py) for one op on one backend, with
    its common case compiled: inputs already of the kernel's type and shape
    (no cast, no broadcast copy). The op's own ``_cuda_plan`` decides, once
    per signature of input shapes and dtypes; any other case runs the op's
    Python launcher. Kernel arguments as the op's launcher passes them:
    ``(x, x.size)`` per input, then the output and its size.

    ``run(a, b)`` is the entry point (the core calls it per op: a method
    with fixed arguments is called without an argument tuple); calling the
    launcher itself does the same."""

    cdef object op, backend, fallback
    cdef dict plans
    cdef Launcher launcher
    cdef MemoryPool pool
    # the signature of the last call and its plan: a repeated signature
    # (the same op on results of the same shape) skips the dict lookup;
    # identity of the shape tuples and dtypes held here, so no false match
    cdef object last_shape0, last_dtype0, last_shape1, last_dtype1
    cdef _ElementwisePlan last_plan

    def __init__(self, op, backend):
        self.op, self.backend, self.fallback = op, backend, op.cuda
        self.plans = {}
        self.launcher, self.pool = backend.launcher, backend.pool

    def __call__(self, *xs):
        return self.run(*xs)

    def run(self, a, b=None, *more):
        """The op on device arrays ``a`` (and ``b``, ...): a new array."""
        cdef DeviceArrayBase x, y, out
        cdef _ElementwisePlan plan
        cdef Py_ssize_t off
        cdef char* buf
        if more or type(a) is not _array_type or (b is not None and type(b) is not _array_type):
            return self._general((a,) if b is None else (a, b) + more)
        x = <DeviceArrayBase>a
        if b is None:
            if x.shape is self.last_shape0 and x.dtype is self.last_dtype0 and self.last_shape1 is None:
                plan = self.last_plan
            else:
                plan = self._plan_for((a,), (x.shape, x.dtype))
        else:
            y = <DeviceArrayBase>b
            if (x.shape is self.last_shape0 and x.dtype is self.last_dtype0
                    and y.shape is self.last_shape1 and y.dtype is self.last_dtype1):
                plan = self.last_plan
            else:
                plan = self._plan_for((a, b), (x.shape, x.dtype, y.shape, y.dtype))
        if plan.kernel is None:
            return self.fallback(self.backend, a) if b is None else self.fallback(self.backend, a, b)
        out = _new_array(self.pool, self.backend, plan.out_shape, plan.out_dtype, plan.size, plan.nbytes)
        if plan.size:
            buf = self.launcher.buf
            off = _put_i64(buf, _put_array(buf, 0, x), x.size)
            if b is not None:
                off = _put_i64(buf, _put_array(buf, off, y), y.size)
            off = _put_i64(buf, _put_array(buf, off, out), plan.size)
            if self.launcher.keep is not None:
                # under CUDA-graph capture: inputs from outside the graph's pool stay alive with it
                _keep_blocks(self.launcher.keep, self.launcher.own_pool, (a, out) if b is None else (a, b, out))
            self.launcher.submit_n(plan.kernel, plan.size, off)
        return out

    cdef object _general(self, tuple xs):
        # any number of inputs, or inputs that are not DeviceArrays
        cdef _ElementwisePlan plan
        for x in xs:
            if not isinstance(x, DeviceArrayBase):
                return self.fallback(self.backend, *xs)
        plan = self._plan_for(xs, tuple([(<DeviceArrayBase>x).shape for x in xs]
                                        + [(<DeviceArrayBase>x).dtype for x in xs]))
        if plan.kernel is None:
            return self.fallback(self.backend, *xs)
        y = _new_array(self.pool, self.backend, plan.out_shape, plan.out_dtype, plan.size, plan.nbytes)
        if plan.size:
            args = []
            for x in xs:
                args += [x, (<DeviceArrayBase>x).size]
            args = tuple(args + [y, plan.size])
            size = _pack_into(self.launcher.buf, args, plan.kernel)
            if self.launcher.keep is not None:
                _keep_blocks(self.launcher.keep, self.launcher.own_pool, args)
            self.launcher.submit_n(plan.kernel, plan.size, size)
        return y

    cdef _ElementwisePlan _plan_for(self, tuple xs, tuple key):
        cdef _ElementwisePlan plan = self.plans.get(key)
        if plan is None:
            plan = self._make_plan(xs)
            if len(self.plans) > 256:
                self.plans.clear()
            self.plans[key] = plan
        if len(xs) <= 2:
            self.last_plan = plan
            self.last_shape0, self.last_dtype0 = (<DeviceArrayBase>xs[0]).shape, (<DeviceArrayBase>xs[0]).dtype
            if len(xs) == 2:
                self.last_shape1, self.last_dtype1 = (<DeviceArrayBase>xs[1]).shape, (<DeviceArrayBase>xs[1]).dtype
            else:
                self.last_shape1 = self.last_dtype1 = None
        return plan

    cdef _ElementwisePlan _make_plan(self, tuple xs):
        out_shape, out_dtype, size, casts, kernel, check_pow = self.op._cuda_plan(self.backend, xs)
        cdef _ElementwisePlan plan = _ElementwisePlan.__new__(_ElementwisePlan)
        plan.out_shape, plan.out_dtype = tuple(out_shape), np.dtype(out_dtype)
        plan.size = size
        plan.nbytes = plan.size * <Py_ssize_t>plan.out_dtype.itemsize
        fast = not check_pow and all(dtype is None and not expand for dtype, expand in casts)
        plan.kernel = kernel if fast else None
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
    # the backend of the last call, its kernel, launcher and pool
    cdef object last_backend
    cdef Kernel last_kernel
    cdef Launcher last_launcher
    cdef MemoryPool last_pool

    def __init__(self, op, ctype, name, source, fetch, param_dtypes, out_dtypes, grad_order, bint single):
        self.op, self.ctype, self.name, self.source = op, ctype, name, source
        self.fetch, self.param_dtypes = tuple(fetch), tuple([np.dtype(d) for d in param_dtypes])
        self.out_dtypes = tuple([np.dtype(d) for d in out_dtypes])
        self.grad_order, self.single = tuple(grad_order), single
        self.compiled = {}
        if not self.fetch:
            raise ValueError(f"{name}: a fused backward kernel without parameters")

    def __call__(self, s, g):
        cdef Py_ssize_t j, n = len(self.fetch), size, off
        cdef list params = [None] * n
        cdef list outs
        cdef tuple entry
        cdef bint same = True
        cdef DeviceArrayBase p, p0, out
        cdef char* buf
        for j in range(n):
            entry = <tuple>self.fetch[j]
            src = s if entry[0] else g
            i = entry[1]
            params[j] = src if i is None else src[i]
        p0 = params[0]
        be = p0.backend
        if be is not self.last_backend:
            self._bind(be)
        shape = p0.shape
        for j in range(1, n):
            p = params[j]
            if p.shape is not shape and p.shape != shape:
                same = False
                break
        if same:
            for j in range(n):
                p = params[j]
                if p.dtype is not self.param_dtypes[j] and p.dtype != self.param_dtypes[j]:
                    params[j] = be.cast(p, self.param_dtypes[j])
        elif not self._expand_constants(be, params):
            shape = tuple(np.broadcast_shapes(*[(<DeviceArrayBase>q).shape for q in params]))
            params = [be.broadcast_to(be.cast(q, dt), shape) for q, dt in zip(params, self.param_dtypes)]
        else:
            shape = (<DeviceArrayBase>params[0]).shape
        size = (<DeviceArrayBase>params[0]).size
        outs = [_new_array(self.last_pool, be, shape, dt, size, size * (<object>dt).itemsize)
                for dt in self.out_dtypes]
        if size:
            buf = self.last_launcher.buf
            off = 0
            for q in params:
                off = _put_array(buf, off, <DeviceArrayBase>q)
                if off < 0:
                    raise ValueError(f"{self.name}: kernel arguments take more than {PARAM_BYTES} bytes")
            for q in outs:
                off = _put_array(buf, off, <DeviceArrayBase>q)
                if off < 0:
                    raise ValueError(f"{self.name}: kernel arguments take more than {PARAM_BYTES} bytes")
            off = _put_i64(buf, off, size)
            if off < 0:
                raise ValueError(f"{self.name}: kernel arguments take more than {PARAM_BYTES} bytes")
            if self.last_launcher.keep is not None:
                _keep_blocks(self.last_launcher.keep, self.last_launcher.own_pool, tuple(params + outs))
            self.last_launcher.submit_n(self.last_kernel, size, off)
        if self.single:
            j0 = self.grad_order[0]
            return None if j0 is None else outs[j0]
        return tuple([None if k is None else outs[k] for k in self.grad_order])

    cdef bint _expand_constants(self, be, list params) except -1:
        """The parameters of a Python scalar's operand (``x * 0.5``: a 0-d
        constant beside arrays of one shape) replaced in place by the
        constant expanded to that shape, cached by the backend
        (``Backend.expanded_constant``), and the others cast as on the
        same-shape path: True; False (params untouched) for any other mix."""
        cdef Py_ssize_t j, n = len(params)
        cdef DeviceArrayBase p
        shape = None
        for j in range(n):
            p = params[j]
            if p.size != 1 or len(p.shape) != 0:
                if shape is None:
                    shape = p.shape
                elif p.shape is not shape and p.shape != shape:
                    return False
        if shape is None:
            return False
        expanded = list(params)
        cache = None
        for j in range(n):
            p = params[j]
            if p.shape is not shape and p.shape != shape:
                # the backend's cache read here (no Python frame when warm)
                if cache is None:
                    cache = getattr(be, "_expanded", None)
                    if type(cache) is not dict:
                        return False        # a backend without expanded constants
                got = cache.get((id(p), shape))
                if got is not None and (<tuple>got)[0] is p:
                    e = (<tuple>got)[1]
                else:
                    e = be.expanded_constant(p, shape)
                    if e is None:
                        return False
                expanded[j] = e
        for j in range(n):
            p = expanded[j]
            if p.dtype is not self.param_dtypes[j] and p.dtype != self.param_dtypes[j]:
                expanded[j] = be.cast(p, self.param_dtypes[j])
        params[:] = expanded
        return True

    cdef _bind(self, be):
        k = self.compiled.get(be)
        if k is None:
            k = self.compiled[be] = be.kernel(self.op, self.ctype, name=self.name, source=self.source)
        self.last_kernel, self.last_launcher, self.last_pool = k, be.launcher, be.pool
        self.last_backend = be


# ---------------------------------------------------------------- the core's kernel lookup, compiled
cdef str _CUDA = "cuda"        # interned: the core passes this very string


cdef class LauncherTable:
    """``op -> kernel`` for the core's dispatch (``gradcore.devices.kernel_for``'s
    compiled front): on cpu the op's ``cpu`` kernel; on cuda the launcher
    cached per op, made by ``make(op)`` on a miss (for an elementwise op,
    its ``ElementwiseLauncher``'s ``run``). ``lookup(op, device)`` is the
    core's entry point: keyed by the op's identity (an op's ``__hash__``
    is Python code), without an argument tuple."""

    cdef dict table                     # id(op) -> (op, launcher); the op held, so its id stays its own
    cdef object make

    def __init__(self, make):
        self.table, self.make = {}, make

    def __call__(self, op, device):
        return self.lookup(op, device)

    def lookup(self, op, device):
        """The kernel running ``op`` on ``device``."""
        if device is not _CUDA and device == "cpu":
            return op.cpu
        entry = self.table.get(id(op))
        if entry is not None and (<tuple>entry)[0] is op:
            return (<tuple>entry)[1]
        fn = self.make(op)
        if len(self.table) > 4096:
            self.table.clear()
        self.table[id(op)] = (op, fn)
        return fn

    def clear(self) -> None:
        """Forget every launcher (the backend changed)."""
        self.table.clear()
