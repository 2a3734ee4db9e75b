"""oneDNN's C API through function pointers (the declarations are in
``_onednn.pxd``; the Python face, with the cache and the fallbacks, is
``gradcore/cpu/onednn.py``).

``load(path)`` opens libdnnl with dlopen, finds each function with dlsym
and makes the process's CPU engine and stream. The ``*_primitive``
functions make a primitive descriptor from plain (row-major, NumPy's
layout) memory descriptors and return a ``Primitive``: the primitive, its
memory objects (one per execution argument, their data pointers set per
call) and the size of its scratchpad. ``Primitive.run(*arrays)`` executes
it on C-contiguous NumPy arrays given in the order of ``arg_ids``; the
scratchpad is a NumPy byte array, so it comes from gradcore's host pool.
"""
cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int64_t, uintptr_t
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym

import numpy as np

cnp.import_array()


class OnednnError(RuntimeError):
    """A oneDNN call failed; the message names the call."""


class Unsupported(OnednnError):
    """oneDNN has no implementation of this configuration (dnnl_unimplemented)."""


cdef struct Api:
    f_version version
    f_engine_create engine_create
    f_stream_create stream_create
    f_one_handle stream_wait
    f_md_create_with_strides md_create_with_strides
    f_md_create_with_tag md_create_with_tag
    f_one_handle md_destroy
    f_md_get_size md_get_size
    f_memory_create memory_create
    f_memory_set_data_handle memory_set_data_handle
    f_one_handle memory_destroy
    f_attr_create attr_create
    f_one_handle attr_destroy
    f_attr_set_scratchpad_mode attr_set_scratchpad_mode
    f_attr_set_post_ops attr_set_post_ops
    f_post_ops_create post_ops_create
    f_post_ops_append_eltwise post_ops_append_eltwise
    f_one_handle post_ops_destroy
    f_conv_fwd_pd conv_fwd_pd
    f_conv_bwd_data_pd conv_bwd_data_pd
    f_conv_bwd_weights_pd conv_bwd_weights_pd
    f_pool_fwd_pd pool_fwd_pd
    f_pool_bwd_pd pool_bwd_pd
    f_resampling_fwd_pd resampling_fwd_pd
    f_bnorm_fwd_pd bnorm_fwd_pd
    f_bnorm_bwd_pd bnorm_bwd_pd
    f_matmul_pd matmul_pd
    f_pd_query_md pd_query_md
    f_pd_query pd_query
    f_one_handle pd_destroy
    f_primitive_create primitive_create
    f_primitive_execute primitive_execute
    f_one_handle primitive_destroy
    f_omp_set_num_threads omp_set_num_threads
    f_omp_get_max_threads omp_get_max_threads
    f_md_equal md_equal
    f_reorder_pd reorder_pd
    f_set_cache_capacity set_primitive_cache_capacity

cdef Api api
cdef void* _lib = NULL
cdef dnnl_engine_t _engine = NULL
cdef dnnl_stream_t _stream = NULL
cdef int _threads = 0          # 0: OpenMP's own count (OMP_NUM_THREADS); else set before each run
cdef int _omp_threads = 0      # OpenMP's count when the library loaded (omp_set_num_threads changes it after)

_STATUS = {1: "out of memory", 2: "invalid arguments", 3: "unimplemented", 4: "last implementation reached",
           5: "runtime error", 6: "not required"}

# (C name, offset of its slot in Api): resolved in this order by load()
_NAMES = ("dnnl_version", "dnnl_engine_create", "dnnl_stream_create", "dnnl_stream_wait",
          "dnnl_memory_desc_create_with_strides", "dnnl_memory_desc_create_with_tag", "dnnl_memory_desc_destroy",
          "dnnl_memory_desc_get_size", "dnnl_memory_create", "dnnl_memory_set_data_handle",
          "dnnl_memory_destroy", "dnnl_primitive_attr_create", "dnnl_primitive_attr_destroy",
          "dnnl_primitive_attr_set_scratchpad_mode", "dnnl_primitive_attr_set_post_ops", "dnnl_post_ops_create",
          "dnnl_post_ops_append_eltwise", "dnnl_post_ops_destroy",
          "dnnl_convolution_forward_primitive_desc_create",
          "dnnl_convolution_backward_data_primitive_desc_create",
          "dnnl_convolution_backward_weights_primitive_desc_create",
          "dnnl_pooling_forward_primitive_desc_create", "dnnl_pooling_backward_primitive_desc_create",
          "dnnl_resampling_forward_primitive_desc_create",
          "dnnl_batch_normalization_forward_primitive_desc_create",
          "dnnl_batch_normalization_backward_primitive_desc_create", "dnnl_matmul_primitive_desc_create",
          "dnnl_primitive_desc_query_md", "dnnl_primitive_desc_query", "dnnl_primitive_desc_destroy",
          "dnnl_primitive_create", "dnnl_primitive_execute", "dnnl_primitive_destroy",
          "omp_set_num_threads", "omp_get_max_threads", "dnnl_memory_desc_equal",
          "dnnl_reorder_primitive_desc_create", "dnnl_set_primitive_cache_capacity")


cdef inline void _check(dnnl_status_t status, str what) except *:
    if status == dnnl_success:
        return
    text = f"oneDNN {what} failed: {_STATUS.get(status, f'status {status}')}"
    if status == dnnl_unimplemented:
        raise Unsupported(text)
    raise OnednnError(text)


def load(str path):
    """Open libdnnl at ``path`` (once per process) and make the CPU engine
    and stream; returns (major, minor, patch, git hash). Raises OSError
    when the library does not load or lacks a function."""
    global _lib, _engine, _stream, _omp_threads
    if _lib != NULL:
        return version()
    cdef bytes bpath = path.encode()
    cdef void* lib = dlopen(bpath, RTLD_NOW | RTLD_LOCAL)
    if lib == NULL:
        err = dlerror()
        raise OSError((<bytes>err).decode(errors="replace") if err != NULL else f"dlopen({path}) failed")
    cdef void** slots = <void**>&api
    cdef void* f
    missing = []
    for i, name in enumerate(_NAMES):
        f = dlsym(lib, (<str>name).encode())
        if f == NULL:
            missing.append(name)
        slots[i] = f
    if missing:
        raise OSError(f"{path} lacks {', '.join(missing)}")
    cdef const dnnl_version_t* v = api.version()
    if v.major != 3:
        raise OSError(f"{path} is oneDNN {v.major}.{v.minor}.{v.patch}; gradcore declares the v3 C API")
    cdef dnnl_engine_t engine = NULL
    cdef dnnl_stream_t stream = NULL
    _check(api.engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create (cpu)")
    _check(api.stream_create(&stream, engine, dnnl_stream_in_order), "dnnl_stream_create")
    _lib, _engine, _stream = lib, engine, stream
    _omp_threads = max(api.omp_get_max_threads(), 1)
    return version()


def set_primitive_cache_capacity(int n):
    """The number of primitives oneDNN's own cache keeps (0: none)."""
    if _lib == NULL:
        raise RuntimeError("oneDNN is not loaded")
    _check(api.set_primitive_cache_capacity(n), "dnnl_set_primitive_cache_capacity")


def loaded() -> bool:
    return _lib != NULL


def version():
    """(major, minor, patch, git hash) of the loaded library."""
    if _lib == NULL:
        return None
    cdef const dnnl_version_t* v = api.version()
    return (v.major, v.minor, v.patch, (<bytes>v.hash).decode() if v.hash != NULL else "")


def set_num_threads(int n):
    """Run primitives on ``n`` OpenMP threads (0: OpenMP's own count, from OMP_NUM_THREADS)."""
    global _threads
    _threads = max(n, 0)


cdef inline void _use(int n) noexcept nogil:
    if api.omp_get_max_threads() != n:
        api.omp_set_num_threads(n)


def use_threads(int n=0):
    """Give this thread's OpenMP ``n`` threads (0: ``max_threads()``):
    oneDNN splits a primitive's work for the thread count at its creation,
    so a primitive is made under the count it will run with."""
    if _lib != NULL:
        _use(n if n > 0 else (_threads if _threads > 0 else _omp_threads))


def max_threads() -> int:
    """The threads a large primitive gets: set_num_threads's count, else
    OpenMP's when the library loaded (OMP_NUM_THREADS)."""
    if _lib == NULL:
        return 0
    return _threads if _threads > 0 else _omp_threads


# ---------------------------------------------------------------- memory descriptors
cdef class _Md:
    """An owned dnnl_memory_desc_t."""
    cdef dnnl_memory_desc_t md

    def __dealloc__(self):
        if self.md != NULL:
            api.md_destroy(self.md)


cdef _Md _plain(tuple dims):
    """A float32 row-major (C-contiguous) descriptor of ``dims``."""
    cdef dnnl_dim_t d[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t s[DNNL_MAX_NDIMS]
    cdef int n = len(dims), i
    cdef dnnl_dim_t stride = 1
    for i in range(n - 1, -1, -1):
        d[i] = dims[i]
        s[i] = stride
        stride *= max(d[i], 1)
    cdef _Md out = _Md()
    _check(api.md_create_with_strides(&out.md, n, d, dnnl_f32, s), f"dnnl_memory_desc_create_with_strides {dims}")
    return out


cdef inline const void* _mdp(_Md m):
    return <const void*>m.md if m is not None else NULL


cdef void _fill(dnnl_dim_t* out, tuple values):
    cdef int i
    for i in range(len(values)):
        out[i] = values[i]


cdef class _Attr:
    """An owned primitive attribute: user scratchpad, optional ReLU post-op."""
    cdef dnnl_primitive_attr_t attr

    def __cinit__(self, bint relu=False):
        cdef dnnl_post_ops_t ops = NULL
        _check(api.attr_create(&self.attr), "dnnl_primitive_attr_create")
        _check(api.attr_set_scratchpad_mode(self.attr, dnnl_scratchpad_mode_user), "set_scratchpad_mode")
        if relu:
            _check(api.post_ops_create(&ops), "dnnl_post_ops_create")
            try:
                _check(api.post_ops_append_eltwise(ops, dnnl_eltwise_relu, 0.0, 0.0), "append_eltwise (relu)")
                _check(api.attr_set_post_ops(self.attr, ops), "set_post_ops")
            finally:
                api.post_ops_destroy(ops)

    def __dealloc__(self):
        if self.attr != NULL:
            api.attr_destroy(self.attr)


cdef class _Pd:
    """An owned primitive descriptor."""
    cdef dnnl_primitive_desc_t pd

    def __dealloc__(self):
        if self.pd != NULL:
            api.pd_destroy(self.pd)


# ---------------------------------------------------------------- primitives
cdef enum:
    MAX_ARGS = 12


cdef struct Exec:
    dnnl_primitive_t prim
    int nargs
    int ids[MAX_ARGS]
    dnnl_memory_t mems[MAX_ARGS]
    const void* mds[MAX_ARGS]               # owned by the primitive desc


cdef dnnl_status_t _exec(Exec* e, void** ptrs, bint mine) noexcept nogil:
    """Execute ``e`` with data pointers ``ptrs`` (one per argument, the
    scratchpad last); ``mine``: its cached memory objects are free, else
    the run makes its own."""
    cdef dnnl_exec_arg_t args[MAX_ARGS]
    cdef dnnl_memory_t own[MAX_ARGS]
    cdef dnnl_status_t status = dnnl_success
    cdef int i, made = 0
    for i in range(e.nargs):
        args[i].arg = e.ids[i]
        if mine:
            status = api.memory_set_data_handle(e.mems[i], ptrs[i])
            args[i].memory = e.mems[i]
        else:
            status = api.memory_create(&own[i], e.mds[i], _engine, ptrs[i])
            if status == dnnl_success:
                made += 1
            args[i].memory = own[i]
        if status != dnnl_success:
            break
    if status == dnnl_success:
        status = api.primitive_execute(e.prim, _stream, e.nargs, args)
        if status == dnnl_success:
            status = api.stream_wait(_stream)
    for i in range(made):
        api.memory_destroy(own[i])
    return status


cdef size_t _ALIGN = 64


cdef void* _aligned_buffer(size_t nbytes, list keep) except NULL:
    """A ``nbytes`` buffer at a 64-byte boundary, from a NumPy byte array
    (so from the host pool) that ``keep`` holds until the run is done.
    oneDNN lays out a scratchpad from its base assuming the alignment of
    the buffers it allocates itself: the barrier counters of a
    multi-threaded reduction (the weight gradient's) are updated with
    atomic instructions, and one that straddles two cache lines is a
    split lock, which the kernel throttles (measured: a convolution's
    weight gradient 3-6 ms instead of 40 us, from a pool block under
    32 KiB, which malloc aligns to 16 bytes only)."""
    buf = np.empty(nbytes + _ALIGN, np.uint8)
    keep.append(buf)
    cdef size_t p = <size_t>cnp.PyArray_DATA(<cnp.ndarray>buf)
    return <void*>((p + _ALIGN - 1) & ~(_ALIGN - 1))


cdef class Primitive:
    """A oneDNN primitive with one memory object per execution argument.

    ``run(*arrays)`` takes C-contiguous arrays of the described shapes
    (float32; the pooling workspace a byte array of ``workspace_bytes``) in
    the order of ``arg_ids``, sets the memory objects' data pointers and
    executes on the process's stream without the GIL. Where the primitive
    works in a blocked layout (``blocked``), each such argument has a
    cached reorder primitive: inputs are reordered into a scratch buffer
    before, outputs out of one after. Two threads running one Primitive at
    once: the second makes its own memory objects."""
    cdef Exec ex
    cdef _Pd pd                              # owns the memory descriptors ex.mds points at
    cdef bint busy
    cdef list reorders                       # per argument: None, or the reorder into/out of its layout
    cdef size_t blocked_bytes[MAX_ARGS]
    cdef bint is_input[MAX_ARGS]
    cdef readonly size_t scratchpad_bytes
    cdef readonly size_t workspace_bytes
    cdef readonly str impl
    cdef readonly tuple arg_ids
    cdef public int threads                  # OpenMP threads it runs on (made under this count); 0: max_threads()

    def __dealloc__(self):
        cdef int i
        for i in range(self.ex.nargs):
            if self.ex.mems[i] != NULL:
                api.memory_destroy(self.ex.mems[i])
        if self.ex.prim != NULL:
            api.primitive_destroy(self.ex.prim)

    @property
    def blocked(self):
        """The arguments (indices into ``arg_ids``) held in a blocked layout."""
        return tuple(i for i, r in enumerate(self.reorders or ()) if r is not None)

    def run(self, *arrays):
        cdef int n = len(arrays), i
        if n != self.ex.nargs - 1:
            raise ValueError(f"oneDNN {self.impl}: {self.ex.nargs - 1} arrays expected, got {n}")
        cdef void* user[MAX_ARGS]
        cdef void* ptrs[MAX_ARGS]
        cdef void* re_ptrs[MAX_ARGS][2]
        cdef Exec* re_prim[MAX_ARGS]             # borrowed: self.reorders holds them
        cdef bint re_mine[MAX_ARGS]
        cdef bint any_reorder = self.reorders is not None
        keep = []                                # the scratch buffers, alive until the run is done
        for i in range(n):
            user[i] = ptrs[i] = cnp.PyArray_DATA(<cnp.ndarray>arrays[i])
            re_prim[i] = NULL
        if any_reorder:
            for i in range(n):
                r = self.reorders[i]
                if r is None:
                    continue
                ptrs[i] = _aligned_buffer(self.blocked_bytes[i], keep)
                re_prim[i] = &(<Primitive>r).ex
                re_mine[i] = not (<Primitive>r).busy
                (<Primitive>r).busy = True
                if self.is_input[i]:
                    re_ptrs[i][0], re_ptrs[i][1] = user[i], ptrs[i]
                else:
                    re_ptrs[i][0], re_ptrs[i][1] = ptrs[i], user[i]
        if self.scratchpad_bytes:
            ptrs[n] = _aligned_buffer(self.scratchpad_bytes, keep)
        else:
            ptrs[n] = NULL
        cdef bint mine = not self.busy
        cdef dnnl_status_t status = dnnl_success
        cdef void* rp[3]
        cdef int threads = self.threads if self.threads > 0 else (_threads if _threads > 0 else _omp_threads)
        if mine:
            self.busy = True
        try:
            with nogil:
                _use(threads)
                if any_reorder:
                    for i in range(n):
                        if re_prim[i] != NULL and self.is_input[i] and status == dnnl_success:
                            rp[0], rp[1], rp[2] = re_ptrs[i][0], re_ptrs[i][1], NULL
                            status = _exec(re_prim[i], rp, re_mine[i])
                if status == dnnl_success:
                    status = _exec(&self.ex, ptrs, mine)
                if any_reorder:
                    for i in range(n):
                        if re_prim[i] != NULL and not self.is_input[i] and status == dnnl_success:
                            rp[0], rp[1], rp[2] = re_ptrs[i][0], re_ptrs[i][1], NULL
                            status = _exec(re_prim[i], rp, re_mine[i])
        finally:
            if mine:
                self.busy = False
            if any_reorder:
                for i in range(n):
                    if re_prim[i] != NULL and re_mine[i]:
                        (<Primitive>self.reorders[i]).busy = False
        _check(status, f"execute ({self.impl})")


cdef Primitive _primitive(_Pd pd, tuple ids, tuple plain=None, tuple inputs=None):
    """The primitive of ``pd`` with memory objects for ``ids`` (the execution
    arguments, scratchpad last) described as the primitive desc says.
    ``plain``: per argument (but the scratchpad) the dims of the caller's
    row-major array, or None; where the primitive chose another layout a
    reorder is made (into it for ``inputs[i]``, out of it otherwise)."""
    cdef Primitive p = Primitive()
    cdef int i
    cdef const char* impl = NULL
    cdef _Md user
    cdef _Pd rpd
    p.pd = pd
    p.ex.nargs = len(ids)
    p.arg_ids = ids
    api.pd_query(pd.pd, dnnl_query_impl_info_str, 0, <void*>&impl)
    p.impl = (<bytes>impl).decode() if impl != NULL else "?"
    for i in range(p.ex.nargs):
        p.ex.ids[i] = ids[i]
        p.ex.mds[i] = api.pd_query_md(pd.pd, dnnl_query_exec_arg_md, ids[i])
        if p.ex.mds[i] == NULL:
            raise OnednnError(f"oneDNN {p.impl}: no memory descriptor for argument {ids[i]}")
        _check(api.memory_create(&p.ex.mems[i], p.ex.mds[i], _engine, NULL), "dnnl_memory_create")
    p.scratchpad_bytes = api.md_get_size(api.pd_query_md(pd.pd, dnnl_query_scratchpad_md, 0))
    cdef const void* ws = api.pd_query_md(pd.pd, dnnl_query_workspace_md, 0)
    p.workspace_bytes = api.md_get_size(ws) if ws != NULL else 0
    if plain is not None:
        reorders = [None] * (p.ex.nargs - 1)
        for i in range(p.ex.nargs - 1):
            if plain[i] is None:
                continue
            user = _plain(plain[i])
            if api.md_equal(user.md, p.ex.mds[i]):
                continue
            rpd = _Pd()
            p.is_input[i] = inputs[i]
            p.blocked_bytes[i] = api.md_get_size(p.ex.mds[i])
            if inputs[i]:
                _check(api.reorder_pd(&rpd.pd, user.md, _engine, p.ex.mds[i], _engine, NULL), "reorder (in)")
            else:
                _check(api.reorder_pd(&rpd.pd, p.ex.mds[i], _engine, user.md, _engine, NULL), "reorder (out)")
            reorders[i] = _primitive(rpd, (DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD))
        if any(r is not None for r in reorders):
            p.reorders = reorders
    _check(api.primitive_create(&p.ex.prim, pd.pd), f"dnnl_primitive_create ({p.impl})")
    return p


cdef _Md _any(tuple dims):
    """A float32 descriptor of ``dims`` in the layout the primitive prefers."""
    cdef dnnl_dim_t d[DNNL_MAX_NDIMS]
    _fill(d, dims)
    cdef _Md out = _Md()
    _check(api.md_create_with_tag(&out.md, len(dims), d, dnnl_f32, dnnl_format_tag_any),
           f"dnnl_memory_desc_create_with_tag {dims}")
    return out


cdef _require():
    if _lib == NULL:
        raise OnednnError("oneDNN is not loaded")


def convolution(int direction, tuple src, tuple weights, tuple dst, tuple strides, tuple dilates, tuple pad_l,
                tuple pad_r, bint bias=False, bint relu=False, bint blocked=False):
    """A convolution primitive on plain float32 tensors: ``direction`` 0
    forward (args src, weights, [bias], dst), 1 backward data (diff_dst,
    weights, diff_src), 2 backward weights (diff_dst, src, diff_weights,
    [diff_bias]). ``weights`` is (O, I, K...) or, grouped, (G, O/G, I/G,
    K...); ``dilates`` are oneDNN's (dilation - 1). ``blocked``: the
    primitive picks the layouts of src, weights and dst (its direct JIT
    kernels want channel blocks) and reorders to and from NumPy's run with it."""
    _require()
    cdef _Md s, w, d
    if blocked:
        s, w, d = _any(src), _any(weights), _any(dst)
    else:
        s, w, d = _plain(src), _plain(weights), _plain(dst)
    cdef _Md b = _plain((dst[1],)) if bias else None
    cdef dnnl_dim_t st[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t dl[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t pl[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t pr[DNNL_MAX_NDIMS]
    _fill(st, strides)
    _fill(dl, dilates)
    _fill(pl, pad_l)
    _fill(pr, pad_r)
    cdef _Attr attr = _Attr(relu)
    cdef _Attr plain_attr = _Attr(False)
    cdef _Pd fwd = _Pd(), pd
    what = f"convolution (src {src}, weights {weights}, dst {dst})"
    if direction == 0:
        _check(api.conv_fwd_pd(&fwd.pd, _engine, dnnl_forward_training, dnnl_convolution_direct, s.md, w.md,
                               _mdp(b), d.md, st, dl, pl, pr, attr.attr), "forward " + what)
        ids = (DNNL_ARG_SRC, DNNL_ARG_WEIGHTS) + ((DNNL_ARG_BIAS,) if bias else ()) + (DNNL_ARG_DST,)
        plain = (src, weights) + ((None,) if bias else ()) + (dst,)
        return _primitive(fwd, ids + (DNNL_ARG_SCRATCHPAD,), plain if blocked else None,
                          (True,) * (len(ids) - 1) + (False,))
    _check(api.conv_fwd_pd(&fwd.pd, _engine, dnnl_forward_training, dnnl_convolution_direct, s.md, w.md, _mdp(b),
                           d.md, st, dl, pl, pr, plain_attr.attr), "forward (hint) " + what)
    pd = _Pd()
    if direction == 1:
        _check(api.conv_bwd_data_pd(&pd.pd, _engine, dnnl_convolution_direct, s.md, w.md, d.md, st, dl, pl, pr,
                                    fwd.pd, plain_attr.attr), "backward data " + what)
        return _primitive(pd, (DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC, DNNL_ARG_SCRATCHPAD),
                          (dst, weights, src) if blocked else None, (True, True, False))
    _check(api.conv_bwd_weights_pd(&pd.pd, _engine, dnnl_convolution_direct, s.md, w.md, _mdp(b), d.md, st, dl,
                                   pl, pr, fwd.pd, plain_attr.attr), "backward weights " + what)
    ids = (DNNL_ARG_DIFF_DST, DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS) + ((DNNL_ARG_DIFF_BIAS,) if bias else ())
    plain = (dst, src, weights) + ((None,) if bias else ())
    return _primitive(pd, ids + (DNNL_ARG_SCRATCHPAD,), plain if blocked else None,
                      (True, True, False) + ((False,) if bias else ()))


_POOL_ALGS = {"max": dnnl_pooling_max, "average": dnnl_pooling_avg_include_padding,
              "average_count_exclude_padding": dnnl_pooling_avg_exclude_padding}


def pooling(int direction, str kind, tuple src, tuple dst, tuple strides, tuple kernel, tuple pad_l,
            tuple pad_r):
    """A pooling primitive on plain float32 tensors. ``kind``: "max",
    "average" (counting padding) or "average_count_exclude_padding".
    ``direction`` 0 forward: args src, dst (max: then the workspace, a byte
    array of ``workspace_bytes``, for the backward); 1 forward without a
    workspace (inference); 2 backward: diff_dst, (max: workspace), diff_src."""
    _require()
    cdef int alg = _POOL_ALGS[kind]
    cdef bint ws = alg == dnnl_pooling_max and direction != 1
    cdef _Md s = _plain(src), d = _plain(dst)
    cdef dnnl_dim_t st[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t kr[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t dl[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t pl[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t pr[DNNL_MAX_NDIMS]
    _fill(st, strides)
    _fill(kr, kernel)
    _fill(dl, (0,) * len(kernel))
    _fill(pl, pad_l)
    _fill(pr, pad_r)
    cdef _Attr attr = _Attr(False)
    cdef _Pd fwd = _Pd(), pd
    what = f"pooling {kind} (src {src}, dst {dst}, kernel {kernel})"
    prop = dnnl_forward_inference if direction == 1 else dnnl_forward_training
    _check(api.pool_fwd_pd(&fwd.pd, _engine, prop, alg, s.md, d.md, st, kr, dl, pl, pr, attr.attr), "forward " + what)
    if direction != 2:
        return _primitive(fwd, (DNNL_ARG_SRC, DNNL_ARG_DST) + ((DNNL_ARG_WORKSPACE,) if ws else ())
                          + (DNNL_ARG_SCRATCHPAD,))
    pd = _Pd()
    _check(api.pool_bwd_pd(&pd.pd, _engine, alg, s.md, d.md, st, kr, dl, pl, pr, fwd.pd, attr.attr),
           "backward " + what)
    return _primitive(pd, (DNNL_ARG_DIFF_DST,) + ((DNNL_ARG_WORKSPACE,) if ws else ())
                      + (DNNL_ARG_DIFF_SRC, DNNL_ARG_SCRATCHPAD))


def resampling(tuple src, tuple dst):
    """A linear resampling forward primitive (bilinear for 2-D sizes:
    PyTorch's ``align_corners=False``) on plain float32 tensors (N, C, *S),
    its factors the sizes' ratios; args src, dst."""
    _require()
    cdef _Md s = _plain(src), d = _plain(dst)
    cdef _Attr attr = _Attr(False)
    cdef _Pd fwd = _Pd()
    _check(api.resampling_fwd_pd(&fwd.pd, _engine, dnnl_forward_training, dnnl_resampling_linear, NULL, s.md, d.md,
                                 attr.attr), f"resampling linear (src {src}, dst {dst})")
    return _primitive(fwd, (DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD))


cdef _Md _channel_blocked(tuple dims):
    """A float32 descriptor of (N, C, *spatial) in blocks of 16 channels (nCw16c, nChw16c, nCdhw16c)."""
    cdef dnnl_dim_t d[DNNL_MAX_NDIMS]
    _fill(d, dims)
    cdef int tag = {3: dnnl_aBc16b, 4: dnnl_aBcd16b, 5: dnnl_aBcde16b}[len(dims)]
    cdef _Md out = _Md()
    _check(api.md_create_with_tag(&out.md, len(dims), d, dnnl_f32, tag), f"dnnl_memory_desc_create_with_tag {dims}")
    return out


def batch_norm(int kind, tuple shape, float eps, bint blocked=False):
    """A batch normalisation primitive (per channel, axis 1) on plain
    float32 tensors with scale and shift. ``kind`` 0 training forward: args
    src, scale, shift, dst, mean, variance (the batch's, biased); 1
    inference: src, mean, variance, scale, shift, dst; 2 backward: src,
    mean, variance, diff_dst, scale, diff_src, diff_scale, diff_shift."""
    _require()
    cdef _Md x = _channel_blocked(shape) if blocked else _plain(shape)
    cdef _Attr attr = _Attr(False)
    cdef unsigned flags = dnnl_use_scale | dnnl_use_shift
    cdef _Pd fwd = _Pd(), pd
    what = f"batch normalization (src {shape}, eps {eps})"
    if kind == 1:
        _check(api.bnorm_fwd_pd(&fwd.pd, _engine, dnnl_forward_inference, x.md, x.md, eps,
                                flags | dnnl_use_global_stats, attr.attr), "inference " + what)
        return _primitive(fwd, (DNNL_ARG_SRC, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE, DNNL_ARG_SCALE, DNNL_ARG_SHIFT,
                                DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD),
                          (shape, None, None, None, None, shape) if blocked else None, (True,) * 5 + (False,))
    _check(api.bnorm_fwd_pd(&fwd.pd, _engine, dnnl_forward_training, x.md, x.md, eps, flags, attr.attr),
           "training forward " + what)
    if kind == 0:
        return _primitive(fwd, (DNNL_ARG_SRC, DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_DST, DNNL_ARG_MEAN,
                                DNNL_ARG_VARIANCE, DNNL_ARG_SCRATCHPAD),
                          (shape, None, None, shape, None, None) if blocked else None, (True,) * 3 + (False,) * 3)
    pd = _Pd()
    _check(api.bnorm_bwd_pd(&pd.pd, _engine, dnnl_backward, x.md, x.md, x.md, eps, flags, fwd.pd, attr.attr),
           "backward " + what)
    return _primitive(pd, (DNNL_ARG_SRC, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE, DNNL_ARG_DIFF_DST, DNNL_ARG_SCALE,
                           DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_SCALE, DNNL_ARG_DIFF_SHIFT, DNNL_ARG_SCRATCHPAD),
                      (shape, None, None, shape, None, shape, None, None) if blocked else None,
                      (True,) * 5 + (False,) * 3)


cdef _Md _strided(tuple dims, tuple strides):
    """A float32 descriptor of ``dims`` with ``strides`` in elements (a transposed view)."""
    cdef dnnl_dim_t d[DNNL_MAX_NDIMS]
    cdef dnnl_dim_t st[DNNL_MAX_NDIMS]
    _fill(d, dims)
    _fill(st, strides)
    cdef _Md out = _Md()
    _check(api.md_create_with_strides(&out.md, len(dims), d, dnnl_f32, st),
           f"dnnl_memory_desc_create_with_strides {dims} {strides}")
    return out


def matmul(tuple a, tuple b, tuple c, tuple a_strides=None, tuple b_strides=None):
    """A matmul primitive on float32: c (M, N) = a (M, K) @ b (K, N) (args
    src, weights, dst), c row-major; a and b row-major, or with the given
    strides (in elements: (1, M) is a's transposed view)."""
    _require()
    cdef _Md s = _strided(a, a_strides) if a_strides is not None else _plain(a)
    cdef _Md w = _strided(b, b_strides) if b_strides is not None else _plain(b)
    cdef _Md d = _plain(c)
    cdef _Attr attr = _Attr(False)
    cdef _Pd pd = _Pd()
    _check(api.matmul_pd(&pd.pd, _engine, s.md, w.md, NULL, d.md, attr.attr), f"matmul {a} @ {b}")
    return _primitive(pd, (DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD))
