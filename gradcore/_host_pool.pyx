# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""A caching allocator for the data of NumPy arrays (NumPy's NEP 49 handler).

Why: a training step allocates the same multi-megabyte arrays every step
(activations, GEMM outputs, gradients). glibc's malloc serves blocks that
large with mmap or from the top of the heap, and hands them back to the
kernel when they are freed, so every step pays for page faults and for the
kernel zeroing fresh pages: on a 2-core machine, about half of an MLP step.
Like PyTorch's caching allocators, this keeps freed large blocks and hands
them out again to the next request of the same size class.

- Blocks under ``POOL_MIN`` bytes go straight to malloc/free (its thread
  caches are fast for them).
- Larger blocks are rounded up to one of 8 size classes per power of two
  (at most 12.5% slack) and, when freed, kept on a per-class free list.
- The cached bytes are bounded (``set_limit``); a block that would exceed
  the bound first empties the cache (the workload changed: the cached
  shapes are stale), then is kept if it fits, else freed.

Every block carries a small header in front of its data with what malloc
returned and its capacity, so ``free`` never relies on the size NumPy passes.
The handler is thread-safe (one mutex around the free lists); it holds no
Python objects and never needs the GIL.
"""
from cpython.pycapsule cimport PyCapsule_New
from cpython.ref cimport PyObject
from libc.stdint cimport uintptr_t, uint8_t
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
    int __builtin_clzll(unsigned long long) nogil

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t*, void*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_unlock(pthread_mutex_t*)

_import_array()

# A header of 32 bytes sits right before the data of every block.
ctypedef struct Header:
    void* base            # what malloc/calloc returned (to free)
    size_t capacity       # usable bytes from the data pointer on
    Header* next          # free-list link while the block is cached
    size_t pooled         # 1: a size-classed block that may be cached

cdef enum:
    HEADER = 32           # sizeof(Header)
    ALIGN = 64            # data alignment of pooled blocks (cache lines, AVX-512)
    N_CLASSES = 512       # 8 classes per power of two, up to 2**64

cdef size_t POOL_MIN = 32 * 1024
cdef Header* _free_lists[N_CLASSES]
cdef size_t _cached_bytes = 0
cdef size_t _limit = 256 * 1024 * 1024
cdef size_t _hits = 0, _misses = 0, _flushes = 0
cdef pthread_mutex_t _lock
cdef PyDataMem_Handler _handler


cdef inline int _size_class(size_t size, size_t* capacity) noexcept nogil:
    """Class index of a request >= POOL_MIN and the capacity of its class:
    8 equal steps between consecutive powers of two (at most 12.5% slack)."""
    cdef int top = 63 - __builtin_clzll(size - 1)       # 2**top < size <= 2**(top + 1)
    cdef int shift = top - 3                             # a step is 2**top / 8
    cdef size_t cap = ((size - 1) >> shift) + 1          # in 9..16 steps
    capacity[0] = cap << shift
    return top * 8 + <int>cap - 9


cdef inline void* _data_of(Header* h) noexcept nogil:
    return <void*>(<char*>h + HEADER)


cdef inline Header* _header_of(void* data) noexcept nogil:
    return <Header*>(<char*>data - HEADER)


cdef void* _new_block(size_t size, bint zero) noexcept nogil:
    global _cached_bytes, _hits, _misses
    cdef size_t cap = size
    cdef int cls = -1
    cdef Header* h
    cdef void* base
    cdef uintptr_t data
    if size >= POOL_MIN:
        cls = _size_class(size, &cap)
        pthread_mutex_lock(&_lock)
        h = _free_lists[cls]
        if h is not NULL:
            _free_lists[cls] = h.next
            _cached_bytes -= cap
            _hits += 1
            pthread_mutex_unlock(&_lock)
            if zero:
                memset(_data_of(h), 0, size)
            return _data_of(h)
        _misses += 1
        pthread_mutex_unlock(&_lock)
        base = calloc(1, cap + HEADER + ALIGN) if zero else malloc(cap + HEADER + ALIGN)
        if base is NULL:
            return NULL
        data = (<uintptr_t>base + HEADER + ALIGN - 1) & ~(<uintptr_t>(ALIGN - 1))
    else:
        base = calloc(1, size + HEADER) if zero else malloc(size + HEADER)
        if base is NULL:
            return NULL
        data = <uintptr_t>base + HEADER
    h = _header_of(<void*>data)
    h.base = base
    h.capacity = cap
    h.next = NULL
    h.pooled = cls >= 0
    return <void*>data


cdef void _flush_locked() noexcept nogil:
    global _cached_bytes
    cdef int i
    cdef Header* h
    cdef Header* nxt
    for i in range(N_CLASSES):
        h = _free_lists[i]
        while h is not NULL:
            nxt = h.next
            free(h.base)
            h = nxt
        _free_lists[i] = NULL
    _cached_bytes = 0


cdef void _release(void* data) noexcept nogil:
    global _cached_bytes, _flushes
    cdef Header* h = _header_of(data)
    cdef size_t cap = h.capacity
    cdef int cls
    if h.pooled:
        cls = _size_class(cap, &cap)
        pthread_mutex_lock(&_lock)
        if _cached_bytes + cap > _limit and _cached_bytes:
            _flush_locked()
            _flushes += 1
        if cap <= _limit:
            h.next = _free_lists[cls]
            _free_lists[cls] = h
            _cached_bytes += cap
            pthread_mutex_unlock(&_lock)
            return
        pthread_mutex_unlock(&_lock)
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
    if new_size <= h.capacity and (new_size >= POOL_MIN) == <bint>h.pooled:
        return ptr
    out = _new_block(new_size, False)
    if out is NULL:
        return NULL
    memcpy(out, ptr, new_size if new_size < h.capacity else h.capacity)
    _release(ptr)
    return out


cdef void _h_free(void* ctx, void* ptr, size_t size) noexcept nogil:
    if ptr is not NULL:
        _release(ptr)


pthread_mutex_init(&_lock, NULL)
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
    """Bound the bytes kept in the cache (0 keeps nothing)."""
    global _limit
    with nogil:
        pthread_mutex_lock(&_lock)
        _limit = nbytes
        if _cached_bytes > _limit:
            _flush_locked()
        pthread_mutex_unlock(&_lock)


def empty_cache():
    """Free every cached block."""
    with nogil:
        pthread_mutex_lock(&_lock)
        _flush_locked()
        pthread_mutex_unlock(&_lock)


def stats() -> dict:
    """Counters: hits and misses of pooled requests, cached bytes, limit,
    times the cache was emptied because it was full, the pooling threshold."""
    return {"hits": _hits, "misses": _misses, "cached_bytes": _cached_bytes,
            "limit": _limit, "flushes": _flushes, "min_block": POOL_MIN}
