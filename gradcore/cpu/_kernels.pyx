"""Small CPU loops where NumPy's own are slow, with NumPy's results bit for
bit (but for the row statistics below) (the elementwise table's rows and the indexing ops call them;
``ops/elemwise.py``, ``ops/indexing.py``):

* ``select(cond, a, b)``: ``np.where`` for a contiguous bool condition and
  float operands of its shape or scalars. NumPy's ``where`` branches per
  element (memmove of the chosen item): 4.4 ms for 262,144 random floats
  here, against ~0.1 ms for this branch-free loop, which the compiler
  turns into vector blends. It is ReLU's and maximum's gradient, clip, the
  stable sigmoid.
* ``sigmoid_finish(x, e)``: the stable sigmoid's last step, in place in
  ``e = exp(-|x|)``: ``(x >= 0 ? 1 : e) / (1 + e)``.
* ``relu(x)``: ``np.maximum(x, 0)`` (NaN kept, -0.0 to 0), which NumPy
  runs 4x slower with a scalar operand than with two arrays.
* ``erf(x)``: C's ``erf`` in double, rounded to the input's float type: the
  values ``math.erf`` gives (GELU), without a Python call per element;
  float32 four at a time through glibc's vector erf where there is one.
* ``scatter_add(out, offsets, src)``: ``out.flat[offsets[i]] += src[i]`` in
  order, ``np.add.at``'s additions (the backward of an index or a gather)
  without its per-element dispatch.
* ``scatter_add_rows(out, rows, src)``: the same for whole rows along the
  first axis (``x[index]``'s and an embedding's backward): no offsets per
  element, a vectorised inner loop.
* ``last_writes(offsets, size)``: which entries of an assignment's flat
  offsets stand (the last one of a repeated offset), in one pass instead
  of a sort.
* ``standardize_rows(x, n, eps)`` / ``standardize_rows_backward(g, y, s,
  n)``: layer and group norm's statistics a row at a time (the Standardize
  op over trailing axes); the one exception to "bit for bit": its sums run
  in double, so they differ from NumPy's float32 sums in the last bits.
* ``cumsum(x, outer, n, inner, reverse)``: ``np.cumsum`` along an axis
  (reversed: from its end), NumPy's sequential additions, in C loops.
* ``norm_affine(x, w, b, n, groups, inner, eps)`` /
  ``norm_affine_backward(g, gm, gs, x, w, m, s, n, groups, inner)``: the same with
  layer and group norm's per-channel ``* w + b`` in the pass (the
  StandardizeAffine op), the backward's weight and bias sums too.
* ``one_hot_pick(x, index, outer, n, inner)`` / ``one_hot_put(g, index,
  outer, n, inner)``: ``indexing_one_hot`` (``take_along_axis``: 7 us for
  256 labels, most of nll_loss's pick) and its adjoint, the index range
  checked in the same pass.

Each returns None where its fast case does not apply; the caller then uses
NumPy.

Example::

    >>> from gradcore.cpu._kernels import select
    >>> select(np.array([True, False]), np.float32(1), np.zeros(2, np.float32))
    array([1., 0.], dtype=float32)
"""
cimport numpy as cnp
import numpy as np
from libc.math cimport erf as c_erf

cnp.import_array()

ctypedef fused real:
    float
    double

cdef object _f32 = np.dtype(np.float32)
cdef object _f64 = np.dtype(np.float64)


# The loops in C: every operand loaded unconditionally and ``restrict``
# pointers, so the compiler vectorises the selection into blends (Cython's
# conditional expression compiles to a branch, and a branchy loop is what
# makes NumPy's where slow).
cdef extern from *:
    """
    /* name##_f or name##_d by the element type: one dispatch for every kernel */
    #define GC_BY_TYPE(f64, name, ...) ((f64) ? name##_d(__VA_ARGS__) : name##_f(__VA_ARGS__))
    /* an AVX2 copy of a loop beside the baseline one, chosen at load time by the CPU
       (GCC's function multiversioning); AVX2 without FMA, so both copies round alike */
    #if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
    #define GC_VECTOR __attribute__((target_clones("avx2", "default")))
    #else
    #define GC_VECTOR
    #endif
    #define GC_SELECT_LOOPS(T, S)                                                          \
    static void gc_sel_aa_##S(const char* restrict c, const T* restrict a,                \
                              const T* restrict b, T* restrict o, Py_ssize_t n) {         \
        for (Py_ssize_t i = 0; i < n; i++) { T av = a[i], bv = b[i]; o[i] = c[i] ? av : bv; } \
    }                                                                                     \
    static void gc_sel_as_##S(const char* restrict c, const T* restrict a, T b,           \
                              T* restrict o, Py_ssize_t n) {                              \
        for (Py_ssize_t i = 0; i < n; i++) { T av = a[i]; o[i] = c[i] ? av : b; }         \
    }                                                                                     \
    static void gc_sel_sa_##S(const char* restrict c, T a, const T* restrict b,           \
                              T* restrict o, Py_ssize_t n) {                              \
        for (Py_ssize_t i = 0; i < n; i++) { T bv = b[i]; o[i] = c[i] ? a : bv; }         \
    }                                                                                     \
    /* NumPy's where(x >= 0, 1, e) / (1 + e): the same two operations */                  \
    static void gc_sig_##S(const T* restrict x, T* restrict e, Py_ssize_t n) {            \
        for (Py_ssize_t i = 0; i < n; i++) { T ev = e[i]; e[i] = (x[i] >= 0 ? (T)1 : ev) / ((T)1 + ev); } \
    }                                                                                     \
                                                                                          \
    /* NumPy's maximum(x, 0): x where x > 0 or x is NaN, else 0 (-0.0 gives 0) */         \
    static void gc_relu_##S(const T* restrict x, T* restrict o, Py_ssize_t n) {           \
        for (Py_ssize_t i = 0; i < n; i++) { T v = x[i]; o[i] = (v > 0 || v != v) ? v : (T)0; } \
    }
    GC_SELECT_LOOPS(float, f)
    GC_SELECT_LOOPS(double, d)
    /* functions, not macros: _unary takes them by address */
    static void gc_sig(int f64, const void* x, void* e, Py_ssize_t n) { GC_BY_TYPE(f64, gc_sig, x, e, n); }
    static void gc_relu(int f64, const void* x, void* o, Py_ssize_t n) { GC_BY_TYPE(f64, gc_relu, x, o, n); }
    """
    void gc_sel_aa_f(const char* c, const float* a, const float* b, float* o, Py_ssize_t n) nogil
    void gc_sel_as_f(const char* c, const float* a, float b, float* o, Py_ssize_t n) nogil
    void gc_sel_sa_f(const char* c, float a, const float* b, float* o, Py_ssize_t n) nogil
    void gc_sel_aa_d(const char* c, const double* a, const double* b, double* o, Py_ssize_t n) nogil
    void gc_sel_as_d(const char* c, const double* a, double b, double* o, Py_ssize_t n) nogil
    void gc_sel_sa_d(const char* c, double a, const double* b, double* o, Py_ssize_t n) nogil
    void gc_sig(int f64, const void* x, void* e, Py_ssize_t n) noexcept nogil
    void gc_relu(int f64, const void* x, void* o, Py_ssize_t n) noexcept nogil


ctypedef void (*_unary_kernel)(int, const void*, void*, Py_ssize_t) noexcept nogil


cdef object _unary(_unary_kernel kernel, object x, object out):
    """``kernel`` over the float32/float64 ``x`` (checked by the caller) into ``out``; returns out."""
    cdef Py_ssize_t n = x.size
    cdef int f64 = x.dtype == _f64
    cdef void* p[2]
    p[:] = [_data(x), _data(out)]
    with nogil:
        kernel(f64, p[0], p[1], n)
    return out


cdef inline void* _data(object a):
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline bint _dense(cnp.ndarray a):
    return cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISALIGNED(a)


cdef bint _dense_real(object a):
    """a is a contiguous float32 or float64 array: what every kernel here takes."""
    return isinstance(a, cnp.ndarray) and _dense(<cnp.ndarray>a) and (a.dtype == _f32 or a.dtype == _f64)


cdef bint _dense_like(object a, object x):
    """a is a contiguous array of x's dtype."""
    return isinstance(a, cnp.ndarray) and _dense(<cnp.ndarray>a) and a.dtype == x.dtype


cdef bint _writeable(object a):
    return (<cnp.ndarray>a).flags.writeable


cdef bint _dense_int64(object a):
    return isinstance(a, cnp.ndarray) and _dense(<cnp.ndarray>a) and a.dtype == np.int64


cdef object _operand(object v, tuple shape):
    """(array, is_scalar) for a select operand, or None: an array of the
    condition's shape, contiguous, or a one-element array / Python number."""
    if isinstance(v, cnp.ndarray):
        if (<cnp.ndarray>v).size == 1 and (<cnp.ndarray>v).ndim <= len(shape):
            return v, True
        if v.shape == shape and _dense(<cnp.ndarray>v):
            return v, False
        return None
    if isinstance(v, (float, int)) and not isinstance(v, bool):
        return v, True
    return None


cdef double _scalar(object v):
    if isinstance(v, cnp.ndarray):
        return float(v.reshape(-1)[0])
    return float(v)


def select(cond, a, b):
    """``np.where(cond, a, b)`` for a contiguous bool ``cond`` and float32 or
    float64 operands (of ``cond``'s shape, contiguous, or one element), else
    None. The result dtype is NumPy's (a Python number takes the array's)."""
    if not isinstance(cond, cnp.ndarray) or cond.dtype != np.bool_ or not _dense(<cnp.ndarray>cond):
        return None
    shape = cond.shape
    pa = _operand(a, shape)
    pb = _operand(b, shape)
    if pa is None or pb is None or (pa[1] and pb[1]):
        return None
    dt = np.result_type(a, b)
    if dt != _f32 and dt != _f64:
        return None
    # a one-element array of another dtype would change NumPy's result
    # type; an array operand already has ``dt`` if it is float32/64 and the
    # result is: anything else goes to NumPy
    for v in (a, b):
        if isinstance(v, cnp.ndarray) and v.dtype != dt:
            return None
    cdef cnp.ndarray out = np.empty(shape, dt)
    cdef Py_ssize_t n = out.size
    cdef const char* c = <const char*>cnp.PyArray_DATA(<cnp.ndarray>cond)
    cdef cnp.ndarray xa, xb
    if not pa[1] and not pb[1]:
        xa, xb = a, b
        if dt == _f32:
            with nogil:
                gc_sel_aa_f(c, <float*>cnp.PyArray_DATA(xa), <float*>cnp.PyArray_DATA(xb),
                        <float*>cnp.PyArray_DATA(out), n)
        else:
            with nogil:
                gc_sel_aa_d(c, <double*>cnp.PyArray_DATA(xa), <double*>cnp.PyArray_DATA(xb),
                        <double*>cnp.PyArray_DATA(out), n)
    elif pb[1]:
        xa = a
        if dt == _f32:
            gc_sel_as_f(c, <float*>cnp.PyArray_DATA(xa), <float>_scalar(b), <float*>cnp.PyArray_DATA(out), n)
        else:
            gc_sel_as_d(c, <double*>cnp.PyArray_DATA(xa), <double>_scalar(b), <double*>cnp.PyArray_DATA(out), n)
    else:
        xb = b
        if dt == _f32:
            gc_sel_sa_f(c, <float>_scalar(a), <float*>cnp.PyArray_DATA(xb), <float*>cnp.PyArray_DATA(out), n)
        else:
            gc_sel_sa_d(c, <double>_scalar(a), <double*>cnp.PyArray_DATA(xb), <double*>cnp.PyArray_DATA(out), n)
    return out


def sigmoid_finish(x, e):
    """Write ``where(x >= 0, 1, e) / (1 + e)`` into ``e`` (``exp(-|x|)``,
    same shape and float dtype as ``x``, both contiguous) and return it; None
    (``e`` untouched) where that does not hold."""
    if not (_dense_real(x) and _dense_like(e, x) and x.shape == e.shape and _writeable(e)):
        return None
    return _unary(gc_sig, x, e)


def relu(x):
    """``np.maximum(x, 0)`` of a contiguous float32 or float64 array; None
    for anything else."""
    if not _dense_real(x):
        return None
    return _unary(gc_relu, x, np.empty(x.shape, x.dtype))


# float32 erf four at a time: glibc's vector erf (libmvec, AVX2, in double),
# found at run time; its results rounded to float32 equal C's erf rounded
# (no difference on 4.3 million float32 inputs swept over the whole range;
# tests/ops/test_cpu_kernels.py compares). Elsewhere the scalar loop.
cdef extern from *:
    """
    #include <math.h>
    #if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
    #include <dlfcn.h>
    #include <immintrin.h>
    typedef __m256d (*gc_erf4_fn)(__m256d);
    static gc_erf4_fn gc_erf4 = NULL;
    static int gc_erf4_state = 0;     /* 0 not looked up, 1 found, -1 absent */
    static int gc_erf4_ready(void) {
        if (gc_erf4_state == 0) {
            void* lib = NULL;
            gc_erf4_state = -1;
            __builtin_cpu_init();
            if (__builtin_cpu_supports("avx2")) lib = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
            if (lib) gc_erf4 = (gc_erf4_fn)dlsym(lib, "_ZGVdN4v_erf");
            if (gc_erf4) gc_erf4_state = 1;
        }
        return gc_erf4_state > 0;
    }
    __attribute__((target("avx2")))
    static Py_ssize_t gc_erf4_loop(const float* x, float* o, Py_ssize_t n) {
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4)
            _mm_storeu_ps(o + i, _mm256_cvtpd_ps(gc_erf4(_mm256_cvtps_pd(_mm_loadu_ps(x + i)))));
        return i;
    }
    static Py_ssize_t gc_erf_f32_vector(const float* x, float* o, Py_ssize_t n) {
        return gc_erf4_ready() ? gc_erf4_loop(x, o, n) : 0;
    }
    #else
    static Py_ssize_t gc_erf_f32_vector(const float* x, float* o, Py_ssize_t n) { return 0; }
    #endif
    """
    Py_ssize_t gc_erf_f32_vector(const float* x, float* o, Py_ssize_t n) nogil


cdef void _erf(const real* x, real* o, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        o[i] = <real>c_erf(<double>x[i])


def erf(x):
    """``erf`` of a contiguous float32 or float64 array, each element as
    ``math.erf`` of it rounded to the dtype; None for anything else."""
    if not _dense_real(x):
        return None
    cdef cnp.ndarray out = np.empty(x.shape, x.dtype)
    cdef Py_ssize_t n = x.size
    cdef Py_ssize_t done
    if x.dtype == _f32:
        with nogil:
            done = gc_erf_f32_vector(<float*>cnp.PyArray_DATA(<cnp.ndarray>x), <float*>cnp.PyArray_DATA(out), n)
            _erf(<float*>cnp.PyArray_DATA(<cnp.ndarray>x) + done, <float*>cnp.PyArray_DATA(out) + done, n - done)
    else:
        with nogil:
            _erf(<double*>cnp.PyArray_DATA(<cnp.ndarray>x), <double*>cnp.PyArray_DATA(out), n)
    return out


cdef extern from *:
    """
    #define GC_SCATTER_ADD(T, S)                                                          \
    static Py_ssize_t gc_scatter_add_##S(T* out, Py_ssize_t size, const npy_int64* off,  \
                                         const T* src, Py_ssize_t n) {                   \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            npy_int64 k = off[i];                                                        \
            if (k < 0 || k >= size) return i;                                            \
            out[k] += src[i];                                                            \
        }                                                                                \
        return -1;                                                                       \
    }                                                                                    \
    /* rows: out[off[i], :] += src[i, :], rows of `width` elements */                     \
    static Py_ssize_t gc_scatter_add_rows_##S(T* out, Py_ssize_t nrows, Py_ssize_t width,  \
                                              const npy_int64* off, const T* src,          \
                                              Py_ssize_t n) {                              \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            npy_int64 k = off[i];                                                        \
            if (k < 0 || k >= nrows) return i;                                           \
            T* restrict o = out + k * width;                                             \
            const T* restrict s = src + i * width;                                       \
            for (Py_ssize_t j = 0; j < width; j++) o[j] += s[j];                         \
        }                                                                                \
        return -1;                                                                       \
    }
    GC_SCATTER_ADD(float, f)
    GC_SCATTER_ADD(double, d)
    #define gc_scatter_add(f64, ...) GC_BY_TYPE(f64, gc_scatter_add, __VA_ARGS__)
    #define gc_scatter_add_rows(f64, ...) GC_BY_TYPE(f64, gc_scatter_add_rows, __VA_ARGS__)
    """
    Py_ssize_t gc_scatter_add(bint f64, void* out, Py_ssize_t size, const cnp.npy_int64* off, const void* src,
                              Py_ssize_t n) nogil
    Py_ssize_t gc_scatter_add_rows(bint f64, void* out, Py_ssize_t nrows, Py_ssize_t width,
                                   const cnp.npy_int64* off, const void* src, Py_ssize_t n) nogil


def scatter_add(out, offsets, src):
    """``out.flat[offsets[i]] += src.flat[i]`` for every i in order (the
    additions ``np.add.at`` makes, so its bits) and True, for ``out`` a
    contiguous writeable float32/float64 array, ``offsets`` int64 and
    ``src`` of ``out``'s dtype with as many elements, both contiguous; False
    (nothing done) otherwise. An offset outside ``out`` is an IndexError."""
    if not (_dense_real(out) and _writeable(out) and _dense_like(src, out) and _dense_int64(offsets)
            and offsets.size == src.size):
        return False
    cdef Py_ssize_t size = out.size, n = src.size, bad
    cdef const cnp.npy_int64* off = <const cnp.npy_int64*>cnp.PyArray_DATA(<cnp.ndarray>offsets)
    cdef bint f64 = out.dtype == _f64
    cdef void* p[2]
    p[:] = [_data(out), _data(src)]
    with nogil:
        bad = gc_scatter_add(f64, p[0], size, off, p[1], n)
    if bad >= 0:
        raise IndexError(f"scatter_add: offset {offsets.reshape(-1)[bad]} is out of range for {size} elements")
    return True


def scatter_add_rows(out, rows, src):
    """``out[rows[i]] += src[i]`` for every i in order, whole rows along the
    first axis (``np.add.at(out, rows, src)``'s additions, so its bits), and
    True, for ``out`` contiguous writeable float32/float64 of two or more
    dims, ``rows`` int64 (any shape) and ``src`` contiguous of shape
    ``rows.shape + out.shape[1:]`` and out's dtype; False (nothing done)
    otherwise. A row outside ``out`` is an IndexError."""
    if not (_dense_real(out) and _writeable(out) and out.ndim >= 2 and _dense_like(src, out) and _dense_int64(rows)
            and src.shape == rows.shape + out.shape[1:]):
        return False
    cdef Py_ssize_t nrows = out.shape[0], n = rows.size, bad
    cdef Py_ssize_t width = out.size // nrows if nrows else 0
    cdef const cnp.npy_int64* off = <const cnp.npy_int64*>cnp.PyArray_DATA(<cnp.ndarray>rows)
    cdef bint f64 = out.dtype == _f64
    cdef void* p[2]
    p[:] = [_data(out), _data(src)]
    with nogil:
        bad = gc_scatter_add_rows(f64, p[0], nrows, width, off, p[1], n)
    if bad >= 0:
        raise IndexError(f"scatter_add_rows: row {rows.reshape(-1)[bad]} is out of range for {nrows} rows")
    return True


def last_writes(offsets, Py_ssize_t size):
    """A bool array over the flat int64 ``offsets`` (each in [0, size)):
    True where no later entry has the same offset. NumPy's assignment
    ``y.flat[offsets] = v`` keeps exactly those writes."""
    cdef cnp.ndarray flat = np.ascontiguousarray(offsets, np.int64).reshape(-1)
    cdef Py_ssize_t n = flat.size, i
    cdef cnp.npy_int64 k
    cdef const cnp.npy_int64* off = <const cnp.npy_int64*>cnp.PyArray_DATA(flat)
    cdef cnp.ndarray seen_arr = np.zeros(size, np.uint8)
    cdef cnp.ndarray keep_arr = np.empty(n, np.bool_)
    cdef unsigned char* seen = <unsigned char*>cnp.PyArray_DATA(seen_arr)
    cdef unsigned char* keep = <unsigned char*>cnp.PyArray_DATA(keep_arr)
    with nogil:
        for i in range(n - 1, -1, -1):
            k = off[i]
            if k < 0 or k >= size:
                break
            keep[i] = not seen[k]
            seen[k] = 1
    if n and (off[i] < 0 or off[i] >= size):
        raise IndexError(f"last_writes: offset {off[i]} is out of range for {size} elements")
    return keep_arr


# Layer/group norm's statistics over each row of n contiguous values: the
# Standardize op's forward and backward (ops/nn.py) in one pass over a row
# that sits in the cache, where NumPy made seven passes over the whole
# array. The sums run in double with 8 independent accumulators (a float
# sum's dependency chain would serialise them); the results round to the
# array's type, so they differ from NumPy's float32 pairwise sums in the
# last bits only (more exact, not less).
#
# The affine forms (StandardizeAffine: layer norm's and group norm's
# ``* weight + bias``) apply the scale and shift in the same pass and keep
# only each row's mean and deviation, from which the backward recomputes
# y a row at a time; the backward's per-channel sums (the weight's and the
# bias's gradients) run in the same pass as the row's. A row is
# ``cpg`` channels of ``inner`` values; row r uses the weights of group
# ``r % groups`` (layer norm: one group, ``inner`` 1; group norm's (N, G,
# C/G, HW) view: G groups, ``inner`` HW).
cdef extern from *:
    """
    #include <math.h>
    #define GC_SUM(expr, len, out)                                                       \
        do { double a_[8] = {0, 0, 0, 0, 0, 0, 0, 0}; Py_ssize_t i_ = 0;                 \
             for (; i_ + 8 <= (len); i_ += 8)                                            \
                 for (int k_ = 0; k_ < 8; k_++) { Py_ssize_t i = i_ + k_; a_[k_] += (expr); } \
             for (; i_ < (len); i_++) { Py_ssize_t i = i_; a_[0] += (expr); }            \
             out = ((a_[0] + a_[1]) + (a_[2] + a_[3])) + ((a_[4] + a_[5]) + (a_[6] + a_[7])); } while (0)
    #define GC_STANDARDIZE_LOOPS(T, S)                                                     \
    static inline double gc_sq_##S(T d) { return (double)d * d; }                         \
    /* the row's mean and its deviation sqrt(mean((x - m)^2) + eps), rounded to T */       \
    static inline void gc_row_stats_##S(const T* restrict xr, Py_ssize_t n, double eps,   \
                                        T* m_out, T* sd_out) {                            \
        double sum;                                                                        \
        GC_SUM((double)xr[i], n, sum);                                                    \
        T m = (T)(sum / n);                                                                \
        GC_SUM(gc_sq_##S(xr[i] - m), n, sum);                                             \
        *m_out = m;                                                                        \
        *sd_out = (T)sqrt((double)(T)(sum / n) + (double)(T)eps);                          \
    }                                                                                      \
    GC_VECTOR static void gc_standardize_##S(const T* restrict x, T* restrict y, T* restrict s,      \
                                   Py_ssize_t rows, Py_ssize_t n, double eps) {           \
        for (Py_ssize_t r = 0; r < rows; r++) {                                            \
            const T* restrict xr = x + r * n; T* restrict yr = y + r * n; T m, sd;        \
            gc_row_stats_##S(xr, n, eps, &m, &sd);                                         \
            s[r] = sd;                                                                     \
            for (Py_ssize_t i = 0; i < n; i++) yr[i] = (xr[i] - m) / sd;                   \
        }                                                                                  \
    }                                                                                      \
    GC_VECTOR static void gc_standardize_back_##S(const T* restrict g, const T* restrict y,         \
                                        const T* restrict s, T* restrict dx,              \
                                        Py_ssize_t rows, Py_ssize_t n) {                  \
        for (Py_ssize_t r = 0; r < rows; r++) {                                            \
            const T* restrict gr = g + r * n; const T* restrict yr = y + r * n;           \
            T* restrict dr = dx + r * n; double sg, sgy;                                   \
            GC_SUM((double)gr[i], n, sg);                                                 \
            GC_SUM((double)gr[i] * yr[i], n, sgy);                                        \
            T mg = (T)(sg / n), mgy = (T)(sgy / n), sd = s[r];                             \
            for (Py_ssize_t i = 0; i < n; i++) dr[i] = (gr[i] - mg - yr[i] * mgy) / sd;    \
        }                                                                                  \
    }                                                                                      \
    GC_VECTOR static void gc_norm_affine_##S(const T* restrict x, const T* restrict w,              \
                                   const T* restrict b, T* restrict out, T* restrict mean, \
                                   T* restrict sdev, Py_ssize_t rows, Py_ssize_t n,       \
                                   Py_ssize_t groups, Py_ssize_t inner, double eps) {     \
        const Py_ssize_t cpg = n / inner;                                                  \
        for (Py_ssize_t r = 0; r < rows; r++) {                                            \
            const T* restrict xr = x + r * n; T* restrict o = out + r * n; T m, sd;       \
            gc_row_stats_##S(xr, n, eps, &m, &sd);                                         \
            mean[r] = m; sdev[r] = sd;                                                     \
            const T rs = (T)(1.0 / sd);                                                    \
            const T* restrict wg = w + (r % groups) * cpg;                                 \
            const T* restrict bg = b + (r % groups) * cpg;                                 \
            if (inner == 1) {                                                              \
                for (Py_ssize_t i = 0; i < n; i++) o[i] = (xr[i] - m) * rs * wg[i] + bg[i]; \
            } else {                                                                       \
                for (Py_ssize_t c = 0; c < cpg; c++) {                                     \
                    const T a = wg[c], sh = bg[c];                                         \
                    const T* restrict xc = xr + c * inner; T* restrict oc = o + c * inner; \
                    for (Py_ssize_t j = 0; j < inner; j++) oc[j] = (xc[j] - m) * rs * a + sh; \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    /* dx of the affine form (with the mean's and sdev's own gradients gm, gs: one per */ \
    /* row), and the weight's and bias's gradients summed into dw / db (double,        */ \
    /* groups * cpg each); y recomputed from x, mean and sdev                          */ \
    GC_VECTOR static void gc_norm_affine_back_##S(const T* restrict g, const T* restrict gm,        \
                                        const T* restrict gs, const T* restrict x,        \
                                        const T* restrict w, const T* restrict mean,      \
                                        const T* restrict sdev, T* restrict dx,           \
                                        double* restrict dw, double* restrict db,         \
                                        Py_ssize_t rows, Py_ssize_t n, Py_ssize_t groups, \
                                        Py_ssize_t inner) {                               \
        const Py_ssize_t cpg = n / inner;                                                  \
        for (Py_ssize_t r = 0; r < rows; r++) {                                            \
            const T* restrict gr = g + r * n; const T* restrict xr = x + r * n;           \
            T* restrict dr = dx + r * n;                                                   \
            const T m = mean[r], rs = (T)(1.0 / sdev[r]);                                  \
            const Py_ssize_t k = (r % groups) * cpg;                                       \
            const T* restrict wg = w + k; double* restrict dwg = dw + k;                   \
            double* restrict dbg = db + k;                                                 \
            double sgw = 0, sgwy = 0;                                                      \
            if (inner == 1) {                                                              \
                for (Py_ssize_t i = 0; i < n; i++) {                                       \
                    const T y = (xr[i] - m) * rs;                                          \
                    dwg[i] += (double)gr[i] * y; dbg[i] += gr[i];                          \
                }                                                                          \
                GC_SUM((double)(gr[i] * wg[i]), n, sgw);                                   \
                GC_SUM((double)(gr[i] * wg[i]) * (T)((xr[i] - m) * rs), n, sgwy);          \
            } else {                                                                       \
                for (Py_ssize_t c = 0; c < cpg; c++) {                                     \
                    const T* restrict gc = gr + c * inner; const T* restrict xc = xr + c * inner; \
                    double sg, sgy;                                                        \
                    GC_SUM((double)gc[i], inner, sg);                                     \
                    GC_SUM((double)gc[i] * (T)((xc[i] - m) * rs), inner, sgy);             \
                    dwg[c] += sgy; dbg[c] += sg;                                           \
                    sgw += wg[c] * sg; sgwy += wg[c] * sgy;                                \
                }                                                                          \
            }                                                                              \
            const T mg = (T)(sgw / n), mgy = (T)(sgwy / n);                                \
            /* d m / d x = 1 / n, d s / d x = y / n */                                     \
            const T cm = (T)((double)gm[r] / n), cs = (T)((double)gs[r] / n);              \
            if (inner == 1) {                                                              \
                for (Py_ssize_t i = 0; i < n; i++) {                                       \
                    const T y = (xr[i] - m) * rs;                                          \
                    dr[i] = (gr[i] * wg[i] - mg - y * mgy) * rs + (cm + y * cs);           \
                }                                                                          \
            } else {                                                                       \
                for (Py_ssize_t c = 0; c < cpg; c++) {                                     \
                    const T a = wg[c]; const Py_ssize_t o = c * inner;                     \
                    for (Py_ssize_t j = o; j < o + inner; j++) {                           \
                        const T y = (xr[j] - m) * rs;                                      \
                        dr[j] = (gr[j] * a - mg - y * mgy) * rs + (cm + y * cs);           \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }
    GC_STANDARDIZE_LOOPS(float, f)
    GC_STANDARDIZE_LOOPS(double, d)
    #define gc_standardize(f64, ...) GC_BY_TYPE(f64, gc_standardize, __VA_ARGS__)
    #define gc_standardize_back(f64, ...) GC_BY_TYPE(f64, gc_standardize_back, __VA_ARGS__)
    #define gc_norm_affine(f64, ...) GC_BY_TYPE(f64, gc_norm_affine, __VA_ARGS__)
    #define gc_norm_affine_back(f64, ...) GC_BY_TYPE(f64, gc_norm_affine_back, __VA_ARGS__)
    """
    void gc_standardize(bint f64, const void* x, void* y, void* s, Py_ssize_t rows, Py_ssize_t n, double eps) nogil
    void gc_standardize_back(bint f64, const void* g, const void* y, const void* s, void* dx, Py_ssize_t rows,
                             Py_ssize_t n) nogil
    void gc_norm_affine(bint f64, const void* x, const void* w, const void* b, void* out, void* mean, void* sdev,
                        Py_ssize_t rows, Py_ssize_t n, Py_ssize_t groups, Py_ssize_t inner, double eps) nogil
    void gc_norm_affine_back(bint f64, const void* g, const void* gm, const void* gs, const void* x,
                             const void* w, const void* mean,
                             const void* sdev, void* dx, double* dw, double* db, Py_ssize_t rows, Py_ssize_t n,
                             Py_ssize_t groups, Py_ssize_t inner) nogil


cdef bint _rows_of(object a, Py_ssize_t n):
    return _dense_real(a) and n > 0 and a.size % n == 0


def standardize_rows(x, Py_ssize_t n, double eps):
    """``(y, s)`` with ``d = x - mean``, ``s = sqrt(mean(d * d) + eps)``,
    ``y = d / s`` over each row of ``n`` values of a contiguous float32 or
    float64 ``x`` (its trailing axes); ``s`` has one value per row (the
    caller shapes it). None for anything else."""
    if not _rows_of(x, n):
        return None
    cdef Py_ssize_t rows = x.size // n
    cdef bint f64 = x.dtype == _f64
    cdef cnp.ndarray y = np.empty(x.shape, x.dtype)
    cdef cnp.ndarray s = np.empty(rows, x.dtype)
    cdef void* p[3]
    p[:] = [_data(x), _data(y), _data(s)]
    with nogil:
        gc_standardize(f64, p[0], p[1], p[2], rows, n, eps)
    return y, s


def standardize_rows_backward(g, y, s, Py_ssize_t n):
    """``(g - mean(g) - y * mean(g * y)) / s`` over each row of ``n`` values
    (Standardize's backward through y) for contiguous ``g``, ``y`` of one
    float dtype and ``s`` with one value per row; None for anything else."""
    if not (_rows_of(g, n) and _rows_of(y, n) and _dense_like(s, g) and g.dtype == y.dtype
            and g.shape == y.shape and s.size * n == g.size):
        return None
    cdef Py_ssize_t rows = g.size // n
    cdef bint f64 = g.dtype == _f64
    cdef cnp.ndarray dx = np.empty(g.shape, g.dtype)
    cdef void* p[4]
    p[:] = [_data(g), _data(y), _data(s), _data(dx)]
    with nogil:
        gc_standardize_back(f64, p[0], p[1], p[2], p[3], rows, n)
    return dx


cdef bint _affine_case(object x, object w, object b, Py_ssize_t n, Py_ssize_t groups, Py_ssize_t inner):
    return (_rows_of(x, n) and _dense_like(w, x) and (b is None or _dense_like(b, x)) and groups > 0
            and inner > 0 and n % inner == 0 and (x.size // n) % groups == 0
            and w.size == groups * (n // inner) and (b is None or b.size == w.size))


def norm_affine(x, w, b, Py_ssize_t n, Py_ssize_t groups, Py_ssize_t inner, double eps):
    """``(out, mean, sdev)``: each row of ``n`` values of ``x`` standardized
    (as ``standardize_rows``) and scaled and shifted per channel, ``out =
    (x - mean) / sdev * w + b``, with one mean and one sdev per row. A row
    is ``n // inner`` channels of ``inner`` values; row r takes the
    channels' weights ``w[r % groups]`` (``w``, ``b``: ``(groups, n //
    inner)``, contiguous, x's dtype). None for anything else."""
    if not _affine_case(x, w, b, n, groups, inner) or b is None:
        return None
    cdef Py_ssize_t rows = x.size // n
    cdef bint f64 = x.dtype == _f64
    cdef cnp.ndarray out = np.empty(x.shape, x.dtype)
    cdef cnp.ndarray m = np.empty(rows, x.dtype)
    cdef cnp.ndarray s = np.empty(rows, x.dtype)
    cdef void* p[6]
    p[:] = [_data(x), _data(w), _data(b), _data(out), _data(m), _data(s)]
    with nogil:
        gc_norm_affine(f64, p[0], p[1], p[2], p[3], p[4], p[5], rows, n, groups, inner, eps)
    return out, m, s


def norm_affine_backward(g, gm, gs, x, w, m, s, Py_ssize_t n, Py_ssize_t groups, Py_ssize_t inner):
    """``(dx, dw, db)``, ``norm_affine``'s gradients for the gradients of
    its outputs ``g`` (x's shape), ``gm`` and ``gs`` (one per row), from its
    input ``x``, weight ``w`` and the per-row ``m`` and ``s`` it returned;
    ``dw``, ``db`` flat, ``w.size`` values each. None where
    ``norm_affine``'s case does not hold."""
    if not (_affine_case(x, w, None, n, groups, inner) and _dense_like(g, x) and g.shape == x.shape
            and _dense_like(m, x) and m.size * n == x.size
            and all(_dense_like(t, x) and t.size == m.size for t in (s, gm, gs))):
        return None
    cdef Py_ssize_t rows = x.size // n
    cdef bint f64 = x.dtype == _f64
    cdef cnp.ndarray dx = np.empty(x.shape, x.dtype)
    cdef cnp.ndarray dw = np.zeros(w.size, np.float64)
    cdef cnp.ndarray db = np.zeros(w.size, np.float64)
    cdef void* p[10]
    p[:] = [_data(g), _data(gm), _data(gs), _data(x), _data(w), _data(m), _data(s), _data(dx), _data(dw), _data(db)]
    with nogil:
        gc_norm_affine_back(f64, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], <double*>p[8], <double*>p[9],
                            rows, n, groups, inner)
    return dx, dw.astype(x.dtype), db.astype(x.dtype)


# Cumulative sums along an axis of a contiguous array viewed as (outer, n,
# inner): NumPy's add.accumulate adds in sequence, and so does this (its
# bits), but NumPy walks a last axis element by element through its
# strided loop, and a middle one a row of inner values at a time from
# Python-level iteration; here a row of the last axis is one C loop, and
# a middle axis adds whole rows of inner values (vectorised).
cdef extern from *:
    """
    #define GC_CUMSUM_LOOPS(T, S)                                                          \
    GC_VECTOR static void gc_cumsum_##S(const T* restrict x, T* restrict out, Py_ssize_t outer, \
                                        Py_ssize_t n, Py_ssize_t inner, int reverse) {    \
        /* the k-th step of a scan, from the end when reversed */                          \
        const Py_ssize_t first = reverse ? n - 1 : 0, step = reverse ? -inner : inner;     \
        for (Py_ssize_t o = 0; o < outer; o++) {                                           \
            const T* restrict xo = x + o * n * inner + first * inner;                      \
            T* restrict yo = out + o * n * inner + first * inner;                          \
            if (inner == 1) {                                                              \
                T acc = xo[0]; yo[0] = acc;                                                \
                for (Py_ssize_t k = 1; k < n; k++) { acc += xo[k * step]; yo[k * step] = acc; } \
                continue;                                                                  \
            }                                                                              \
            for (Py_ssize_t j = 0; j < inner; j++) yo[j] = xo[j];                          \
            for (Py_ssize_t k = 1; k < n; k++) {                                           \
                const T* restrict xk = xo + k * step; T* restrict yk = yo + k * step;     \
                const T* restrict yp = yk - step;                                          \
                for (Py_ssize_t j = 0; j < inner; j++) yk[j] = yp[j] + xk[j];              \
            }                                                                              \
        }                                                                                  \
    }
    GC_CUMSUM_LOOPS(float, f)
    GC_CUMSUM_LOOPS(double, d)
    #define gc_cumsum(f64, ...) GC_BY_TYPE(f64, gc_cumsum, __VA_ARGS__)
    """
    void gc_cumsum(bint f64, const void* x, void* out, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner,
                   int reverse) nogil


def cumsum(x, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner, bint reverse):
    """``np.cumsum`` of a contiguous float32 or float64 ``x`` (``outer * n *
    inner`` values) along the axis of n values (from its end when
    ``reverse``), in x's dtype, NumPy's additions in its order; None for
    anything else."""
    if not (_rows_of(x, 1) and n > 0 and outer * n * inner == x.size):
        return None
    cdef bint f64 = x.dtype == _f64
    cdef cnp.ndarray out = np.empty(x.shape, x.dtype)
    cdef void* p[2]
    p[:] = [_data(x), _data(out)]
    with nogil:
        gc_cumsum(f64, p[0], p[1], outer, n, inner, reverse)
    return out



cdef extern from *:
    """
    /* indexing_one_hot along the middle axis of a (outer, n, inner) array a,
       b its (outer, inner) values: picked into b, or (put) b written into a;
       the flat position of the first index outside [0, n), or -1 */
    #define GC_ONE_HOT_LOOPS(T, S, I, J)                                                         \
    static Py_ssize_t gc_one_hot_##S##J(T* restrict a, const I* restrict idx, T* restrict b,    \
                                        Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner, int put) { \
        for (Py_ssize_t o = 0; o < outer; o++)                                                   \
            for (Py_ssize_t i = 0; i < inner; i++) {                                             \
                const Py_ssize_t j = o * inner + i;                                              \
                const I k = idx[j];                                                              \
                if (k < 0 || k >= n) return j;                                                   \
                if (put) a[(o * n + k) * inner + i] = b[j];                                      \
                else b[j] = a[(o * n + k) * inner + i];                                          \
            }                                                                                    \
        return -1;                                                                               \
    }
    GC_ONE_HOT_LOOPS(float, f, int32_t, i)
    GC_ONE_HOT_LOOPS(float, f, int64_t, l)
    GC_ONE_HOT_LOOPS(double, d, int32_t, i)
    GC_ONE_HOT_LOOPS(double, d, int64_t, l)
    static Py_ssize_t gc_one_hot(int f64, int i64, void* a, const void* idx, void* b, Py_ssize_t outer,
                                 Py_ssize_t n, Py_ssize_t inner, int put) {
        if (f64)
            return i64 ? gc_one_hot_dl(a, idx, b, outer, n, inner, put) : gc_one_hot_di(a, idx, b, outer, n, inner, put);
        return i64 ? gc_one_hot_fl(a, idx, b, outer, n, inner, put) : gc_one_hot_fi(a, idx, b, outer, n, inner, put);
    }
    """
    Py_ssize_t gc_one_hot(bint f64, bint i64, void* a, const void* idx, void* b, Py_ssize_t outer,
                          Py_ssize_t n, Py_ssize_t inner, bint put) nogil


cdef object _one_hot(object big, object index, object small, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner,
                     bint put):
    """True when the loop ran over every index (False: one is outside [0, n))."""
    cdef bint f64 = big.dtype == _f64
    cdef bint i64 = index.dtype == np.int64
    cdef void* p[3]
    cdef Py_ssize_t bad
    p[:] = [_data(big), _data(index), _data(small)]
    with nogil:
        bad = gc_one_hot(f64, i64, p[0], p[1], p[2], outer, n, inner, put)
    return bad < 0


cdef bint _one_hot_case(object big, object index, object small, Py_ssize_t outer, Py_ssize_t n,
                        Py_ssize_t inner):
    return (_rows_of(big, 1) and _dense_like(small, big) and isinstance(index, cnp.ndarray)
            and _dense(<cnp.ndarray>index) and (index.dtype == np.int32 or index.dtype == np.int64)
            and outer >= 0 and n > 0 and inner >= 0 and big.size == outer * n * inner
            and small.size == index.size == outer * inner)


def one_hot_pick(x, index, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner):
    """``out[o, i] = x[o, index[o, i], i]`` (flat: the caller shapes it) for
    a contiguous float32/float64 ``x`` of ``outer * n * inner`` values and
    a contiguous int32/int64 ``index`` of ``outer * inner``; None for
    anything else, or where an index is outside [0, n) (the caller's
    NumPy path then says which)."""
    out = np.empty(index.size if isinstance(index, cnp.ndarray) else 0,
                   x.dtype if isinstance(x, cnp.ndarray) else _f32)
    if not _one_hot_case(x, index, out, outer, n, inner):
        return None
    return out if _one_hot(x, index, out, outer, n, inner, False) else None


def one_hot_put(g, index, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner):
    """Zeros of ``outer * n * inner`` values (flat) with ``out[o, index[o,
    i], i] = g[o, i]``: ``one_hot_pick``'s adjoint, for a contiguous float
    ``g`` and int32/int64 ``index`` of ``outer * inner`` values; None as
    there."""
    out = np.zeros(outer * n * inner if outer >= 0 and n > 0 and inner >= 0 else 0,
                   g.dtype if isinstance(g, cnp.ndarray) else _f32)
    if not _one_hot_case(out, index, g, outer, n, inner):
        return None
    return out if _one_hot(out, index, g, outer, n, inner, True) else None
