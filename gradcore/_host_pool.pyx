# The host caching allocator for NumPy array data (gradcore/_host_pool.pyx).
#
# Contract:
#   - ``install()`` makes the pool NumPy's data allocator (NEP 49 handler) in
#     the calling context (NumPy keeps the handler in a context variable, so
#     per thread); ``set_handler(h)`` puts back any handler; both return the
#     one replaced. ``is_active()`` says whether arrays made now use the pool.
#   - Every block the handler returns carries a header in front of its data,
#     so ``free`` and ``realloc`` never trust the size NumPy passes; blocks
#     made before ``install`` (NumPy's own) are never handed to this free.
#   - Large blocks (32 KiB and more) are rounded to 8 size classes per power
#     of two and kept when freed, up to ``set_limit(nbytes)`` bytes; a block
#     that would exceed the bound empties the cache first. Small blocks are
#     rounded to 16 bytes and a few per size are kept. ``empty_cache()``
#     frees the kept large blocks; ``stats()`` reports hits, misses, cached
#     bytes, the limit and flushes, and the bytes in use and kept with their
#     peaks (``reset_peaks()``): gradcore.device's allocated/reserved memory.
#   - The handler's functions hold no Python object and never take the GIL:
#     one spin lock guards the free lists for a few pointer moves, so the
#     pool is safe from any thread, with or without the GIL.
#   - Nothing here knows about tensors, devices or graphs
#     (gradcore/memory.py is its Python face).
#
# (Nothing cimports this module, so it has no .pxd; Cython directives are
# set in setup.py, for every compiled module at once.)
"""A caching allocator for the data of NumPy arrays (NumPy's NEP 49 handler).

Why: a training step allocates the same multi-megabyte arrays every step
(activations, GEMM outputs, gradients). glibc's malloc serves blocks that
large with mmap or from the top of the heap and hands them back to the
kernel when they are freed, so a step can pay for page faults and for the
kernel zeroing fresh pages each time: a third of an MLP step at batch 512 on
a 2-core machine. Like PyTorch's caching allocators, this keeps freed blocks
and hands them out again to the next request of the same size class.

- Large blocks (``LARGE_MIN`` bytes and more) are rounded up to one of 8 size
  classes per power of two (at most 12.5% slack) and kept, when freed, on a
  free list per class. The bytes kept are bounded (``set_limit``); a block
  that would exceed the bound first empties the cache (the workload changed:
  the cached sizes are stale), then is kept if it fits.
- Small blocks (up to ``SMALL_MAX`` bytes) are rounded to 16 bytes and a few
  per size are kept, as NumPy's own allocator does (its small-block cache
  is what we replace).
- Blocks in between go to malloc and free directly.

Every block carries a header in front of its data (what malloc returned, the
capacity, the kind), so ``free`` never relies on the size NumPy passes. One
spin lock guards the caches (held for a few pointer moves only); the handler
holds no Python objects and never needs the GIL.
"""
from cpython.pycapsule cimport PyCapsule_New
from cpython.ref cimport PyObject
from libc.stdint cimport uint8_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset, strncpy

cdef extern from "numpy/arrayobject.h":
    ctypedef struct PyDataMemAllocator:
        void* ctx
        void* (*malloc)(void* ctx, size_t size) noexcept nogil
        void* (*calloc)(void* ctx, size_t nelem, size_t elsize) noexcept nogil
        void* (*realloc)(void* ctx, void* ptr, size_t new_size) noexcept nogil
        void (*free)(void* ctx, void* ptr, size_t size) noexcept nogil
    ctypedef struct PyDataMem_Handler:
        char name[127]
        uint8_t version
        PyDataMemAllocator allocator
    object PyDataMem_SetHandler(object handler)
    object PyDataMem_GetHandler()
    PyObject* PyDataMem_DefaultHandler
    int _import_array() except -1

cdef extern from *:
    """
    #if defined(__x86_64__) || defined(__i386__)
    #define gc_cpu_relax() __builtin_ia32_pause()
    #else
    #define gc_cpu_relax() ((void)0)
    #endif
    """
    int __builtin_clzll(unsigned long long) nogil
    size_t __atomic_add_fetch(size_t* ptr, size_t value, int order) nogil
    size_t __atomic_sub_fetch(size_t* ptr, size_t value, int order) nogil
    size_t __atomic_load_n(size_t* ptr, int order) nogil
    bint __atomic_compare_exchange_n(size_t* ptr, size_t* expected, size_t desired, bint weak,
                                     int success_order, int failure_order) nogil
    bint __atomic_test_and_set(void* ptr, int order) nogil
    void __atomic_clear(void* ptr, int order) nogil
    void gc_cpu_relax() nogil
    int __ATOMIC_ACQUIRE, __ATOMIC_RELEASE, __ATOMIC_RELAXED

_import_array()

ctypedef struct Header:   # right before the data of every block
    void* base            # what malloc/calloc returned (to free)
    size_t capacity       # usable bytes from the data pointer on
    Header* next          # free-list link while a large block is cached
    size_t kind           # PLAIN, SMALL or LARGE

cdef enum:
    HEADER = 32           # sizeof(Header): keeps malloc's 16-byte alignment
    ALIGN = 64            # data alignment of large blocks (cache lines, AVX-512)
    PLAIN = 0
    SMALL = 1
    LARGE = 2
    N_CLASSES = 512       # large: 8 classes per power of two, up to 2**64
    SMALL_MAX = 1024
    N_SMALL = 65          # 16-byte size classes 0..SMALL_MAX
    SMALL_DEPTH = 8       # small blocks kept per 16-byte size

cdef size_t LARGE_MIN = 32 * 1024
cdef Header* _large[N_CLASSES]
cdef Header* _small[N_SMALL][SMALL_DEPTH]
cdef int _small_count[N_SMALL]
cdef size_t _cached_bytes = 0
cdef size_t _limit = 256 * 1024 * 1024
cdef size_t _hits = 0, _misses = 0, _flushes = 0
cdef size_t _small_cached = 0          # bytes of the small blocks kept
# bytes of the blocks handed out and not freed (small and large ones counted
# under the lock their caches take anyway; plain ones, whose path takes no
# lock, atomically), and the peaks of those and of everything taken from
# malloc and not given back (MegEngine's allocated and reserved memory)
cdef size_t _locked_in_use = 0, _plain_in_use = 0
cdef size_t _peak_in_use = 0, _peak_reserved = 0
cdef char _lock = 0
cdef PyDataMem_Handler _handler


cdef inline void _acquire() noexcept nogil:
    while __atomic_test_and_set(&_lock, __ATOMIC_ACQUIRE):
        gc_cpu_relax()


cdef inline void _release_lock() noexcept nogil:
    __atomic_clear(&_lock, __ATOMIC_RELEASE)


cdef inline void _raise_peak(size_t* peak, size_t value) noexcept nogil:
    cdef size_t seen = __atomic_load_n(peak, __ATOMIC_RELAXED)
    while value > seen and not __atomic_compare_exchange_n(peak, &seen, value, True, __ATOMIC_RELAXED,
                                                           __ATOMIC_RELAXED):
        pass


cdef inline int _large_class(size_t size, size_t* capacity) noexcept nogil:
    """Class index of a request >= LARGE_MIN and the capacity of its class:
    8 equal steps between consecutive powers of two."""
    cdef int top = 63 - __builtin_clzll(size - 1)       # 2**top < size <= 2**(top + 1)
    cdef int shift = top - 3                             # a step is 2**top / 8
    cdef size_t steps = ((size - 1) >> shift) + 1        # 9..16
    capacity[0] = steps << shift
    return top * 8 + <int>steps - 9


cdef inline size_t _kind_of(size_t size) noexcept nogil:
    if size <= SMALL_MAX:
        return SMALL
    return LARGE if size >= LARGE_MIN else PLAIN


cdef inline void* _data_of(Header* h) noexcept nogil:
    return <void*>(<char*>h + HEADER)


cdef inline Header* _header_of(void* data) noexcept nogil:
    return <Header*>(<char*>data - HEADER)


cdef void* _new_block(size_t size, bint zero) noexcept nogil:
    global _cached_bytes, _hits, _misses, _small_cached, _locked_in_use
    cdef size_t kind = _kind_of(size)
    cdef size_t cap = size
    cdef size_t pad = 0
    cdef int cls = 0
    cdef Header* h = NULL
    cdef void* base
    cdef uintptr_t data
    cdef size_t in_use
    cdef size_t reserved = 0
    if kind == SMALL:
        cls = <int>((size + 15) >> 4)
        cap = (<size_t>cls) << 4
        _acquire()
        if _small_count[cls]:
            _small_count[cls] -= 1
            h = _small[cls][_small_count[cls]]
            _small_cached -= cap
        _locked_in_use += cap       # counted here, under the lock the cache takes anyway
        in_use = _locked_in_use + __atomic_load_n(&_plain_in_use, __ATOMIC_RELAXED)
        reserved = in_use + _cached_bytes + _small_cached
        _release_lock()
    elif kind == LARGE:
        cls = _large_class(size, &cap)
        pad = ALIGN
        _acquire()
        h = _large[cls]
        if h is not NULL:
            _large[cls] = h.next
            _cached_bytes -= cap
            _hits += 1
        else:
            _misses += 1
        _locked_in_use += cap
        in_use = _locked_in_use + __atomic_load_n(&_plain_in_use, __ATOMIC_RELAXED)
        reserved = in_use + _cached_bytes + _small_cached
        _release_lock()
    else:
        in_use = __atomic_add_fetch(&_plain_in_use, cap, __ATOMIC_RELAXED) + _locked_in_use
        reserved = in_use + _cached_bytes + _small_cached
    _raise_peak(&_peak_in_use, in_use)
    if h is not NULL:
        if zero:
            memset(_data_of(h), 0, size)
        return _data_of(h)
    _raise_peak(&_peak_reserved, reserved)
    base = calloc(1, cap + HEADER + pad) if zero else malloc(cap + HEADER + pad)
    if base is NULL:
        _uncount(kind, cap)
        return NULL
    data = <uintptr_t>base + HEADER
    if pad:
        data = (data + ALIGN - 1) & ~(<uintptr_t>(ALIGN - 1))
    h = _header_of(<void*>data)
    h.base = base
    h.capacity = cap
    h.next = NULL
    h.kind = kind
    return <void*>data


cdef inline void _uncount(size_t kind, size_t cap) noexcept nogil:
    """A block of ``kind`` and ``cap`` bytes is no longer in use."""
    global _locked_in_use
    if kind == PLAIN:
        __atomic_sub_fetch(&_plain_in_use, cap, __ATOMIC_RELAXED)
    else:
        _acquire()
        _locked_in_use -= cap
        _release_lock()


cdef Header* _take_all_large() noexcept nogil:
    """Unlink every cached large block (lock held); returns them as one list."""
    global _cached_bytes
    cdef Header* out = NULL
    cdef Header* h
    cdef Header* nxt
    cdef int i
    for i in range(N_CLASSES):
        h = _large[i]
        while h is not NULL:
            nxt = h.next
            h.next = out
            out = h
            h = nxt
        _large[i] = NULL
    _cached_bytes = 0
    return out


cdef void _free_list(Header* h) noexcept nogil:
    cdef Header* nxt
    while h is not NULL:
        nxt = h.next
        free(h.base)
        h = nxt


cdef void _give_back(void* data) noexcept nogil:
    global _cached_bytes, _flushes, _small_cached, _locked_in_use
    cdef Header* h = _header_of(data)
    cdef Header* stale = NULL
    cdef size_t cap = h.capacity
    cdef int cls
    cdef bint kept = False
    if h.kind == SMALL:
        cls = <int>(cap >> 4)
        _acquire()
        _locked_in_use -= cap
        if _small_count[cls] < SMALL_DEPTH:
            _small[cls][_small_count[cls]] = h
            _small_count[cls] += 1
            _small_cached += cap
            kept = True
        _release_lock()
    elif h.kind == LARGE:
        cls = _large_class(cap, &cap)
        _acquire()
        _locked_in_use -= cap
        if _cached_bytes + cap > _limit and _cached_bytes:
            stale = _take_all_large()
            _flushes += 1
        if cap <= _limit:
            h.next = _large[cls]
            _large[cls] = h
            _cached_bytes += cap
            kept = True
        _release_lock()
        _free_list(stale)              # outside the lock: free() can be slow
    else:
        __atomic_sub_fetch(&_plain_in_use, cap, __ATOMIC_RELAXED)
    if not kept:
        free(h.base)


cdef void* _h_malloc(void* ctx, size_t size) noexcept nogil:
    return _new_block(size, False)


cdef void* _h_calloc(void* ctx, size_t nelem, size_t elsize) noexcept nogil:
    if elsize and nelem > (<size_t>-1) // elsize:
        return NULL
    return _new_block(nelem * elsize, True)


cdef void* _h_realloc(void* ctx, void* ptr, size_t new_size) noexcept nogil:
    cdef Header* h
    cdef void* out
    if ptr is NULL:
        return _new_block(new_size, False)
    h = _header_of(ptr)
    # in place when it fits, stays in its kind and does not waste half the block
    if new_size <= h.capacity and _kind_of(new_size) == h.kind and new_size >= h.capacity // 2:
        return ptr
    out = _new_block(new_size, False)
    if out is NULL:
        return NULL
    memcpy(out, ptr, new_size if new_size < h.capacity else h.capacity)
    _give_back(ptr)
    return out


cdef void _h_free(void* ctx, void* ptr, size_t size) noexcept nogil:
    if ptr is not NULL:
        _give_back(ptr)


strncpy(_handler.name, b"gradcore_host_pool", 127)
_handler.version = 1
_handler.allocator.ctx = NULL
_handler.allocator.malloc = _h_malloc
_handler.allocator.calloc = _h_calloc
_handler.allocator.realloc = _h_realloc
_handler.allocator.free = _h_free

# One capsule for the life of the process: arrays keep a reference to the
# handler that made them, and free through it even after it is replaced.
_capsule = PyCapsule_New(&_handler, b"mem_handler", NULL)


def install():
    """Make the pool NumPy's allocator in the current context (thread);
    returns the handler it replaces."""
    return PyDataMem_SetHandler(_capsule)


def set_handler(handler):
    """Make ``handler`` (a NumPy ``mem_handler`` capsule, or None for NumPy's
    default) the current one; returns the handler it replaces."""
    return PyDataMem_SetHandler(<object>PyDataMem_DefaultHandler if handler is None else handler)


def is_active() -> bool:
    """Whether arrays made now in this context come from the pool."""
    return PyDataMem_GetHandler() is _capsule


def set_limit(size_t nbytes):
    """Bound the bytes of large blocks kept in the cache (0 keeps none)."""
    global _limit
    cdef Header* stale = NULL
    with nogil:
        _acquire()
        _limit = nbytes
        if _cached_bytes > _limit:
            stale = _take_all_large()
        _release_lock()
        _free_list(stale)


def empty_cache():
    """Free every cached large block."""
    cdef Header* stale
    with nogil:
        _acquire()
        stale = _take_all_large()
        _release_lock()
        _free_list(stale)


def stats() -> dict:
    """Counters of large blocks: hits and misses, cached bytes, limit, times
    the cache was emptied because a block did not fit, the size from which a
    block is large; of all blocks: bytes in use and their peak, bytes of the
    small blocks kept, the peak of in use + kept."""
    return {"hits": _hits, "misses": _misses, "cached_bytes": _cached_bytes,
            "limit": _limit, "flushes": _flushes, "min_block": LARGE_MIN,
            "in_use_bytes": _locked_in_use + _plain_in_use, "peak_in_use_bytes": _peak_in_use,
            "small_cached_bytes": _small_cached, "peak_reserved_bytes": _peak_reserved}


def reset_peaks():
    """Start the peaks of ``stats()`` again from what is in use and kept now."""
    global _peak_in_use, _peak_reserved
    _peak_in_use = _locked_in_use + _plain_in_use
    _peak_reserved = _peak_in_use + _cached_bytes + _small_cached
