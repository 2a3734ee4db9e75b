"""Linear algebra: batched matrix multiplication.

On the CPU, float32 products with one (K, N) matrix b of at least
``onednn.matmul_min`` multiply-adds run on oneDNN's matmul primitive
(transposed operands read in place; faster than NumPy's OpenBLAS there,
docs/cpu.md), the rest on NumPy's ``matmul``: a 2-d product below the
thread policy's grain (``onednn.grain``) on one OpenBLAS thread.

On ``cuda``, floating-point products run on cuBLAS (``gemm_rows`` maps a
row-major product onto its column-major strided batched GEMM); integer and
bool products, which cuBLAS lacks, run on a direct kernel
(``direct_matmul_source``) that gives NumPy's exact (wrapping) result.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from gradcore import _core, dtypes
from gradcore.cpu import blas, onednn
from gradcore.cuda.kernels import Kernel
from gradcore.op import Op, TensorDesc

from .elemwise import Elemwise
from .shape import ExpandDims


# OpenBLAS runs a GEMM of up to this many multiply-adds on one thread by itself
# (its SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD)
_OPENBLAS_ONE_THREAD = 1 << 18


class MatrixMul(Op):
    """Batched ``a @ b`` over the last two axes (leading axes broadcast),
    with optional transposition of either operand.

    Example::

        >>> from gradcore.functional import MatrixMul
        >>> a = gc.tensor(np.ones((4, 2, 3), "float32"))
        >>> y, = gc.core.apply(MatrixMul(transpose_b=True), a, a)
        >>> y.shape
        (4, 2, 2)
    """
    name = "MatrixMul"
    attrs = ("transpose_a", "transpose_b")
    reduce_broadcast = True   # batch axes broadcast: grads are summed down centrally

    def __init__(self, transpose_a: bool = False, transpose_b: bool = False):
        self.transpose_a, self.transpose_b = bool(transpose_a), bool(transpose_b)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: plain, transposed and batched."""
        rng = np.random.default_rng(0)
        return [(cls(), [rng.standard_normal((2, 3)), rng.standard_normal((3, 4))]),
                (cls(False, True), [rng.standard_normal((2, 2, 3)), rng.standard_normal((4, 3))])]

    input_dtypes = dtypes.promoted_inputs      # float16 @ float32 in float32

    def infer(self, a, b):
        dtype = dtypes.promote_types(a.dtype, b.dtype)
        if a.shape is None or b.shape is None:
            return (TensorDesc(None, dtype, a.device),)
        if a.ndim < 2 or b.ndim < 2:
            raise self.error("both operands need at least 2 dimensions", a, b)
        m, k = a.shape[-2:][::-1] if self.transpose_a else a.shape[-2:]
        k2, n = b.shape[-2:][::-1] if self.transpose_b else b.shape[-2:]
        if k != k2:
            raise self.error(f"inner dimensions differ ({k} and {k2})", a, b)
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise self.error("batch dimensions cannot be broadcast", a, b) from None
        return (TensorDesc(tuple(batch) + (m, n), dtype, a.device),)

    def cpu(self, a, b):
        if a.ndim < 2 or b.ndim < 2:   # np.matmul would take 1-D operands; this op does not
            raise ValueError("both operands need at least 2 dimensions")
        if self.transpose_a:
            a = np.swapaxes(a, -1, -2)
        if self.transpose_b:
            b = np.swapaxes(b, -1, -2)
        if b.ndim == 2 and a.dtype == b.dtype == np.float32 and a.size and b.size:
            # float32 products with one matrix b on oneDNN where it is faster
            # than NumPy's BLAS (gradcore/cpu/onednn.py: matmul_min); a's
            # leading axes, where they are C-contiguous rows, are more rows
            rows = a if a.ndim == 2 else (a.reshape(a.size // a.shape[-1], a.shape[-1]) if a.flags.c_contiguous
                                          else None)
            c = onednn.matmul(rows, b) if rows is not None else None
            if c is not None:
                return c.reshape(a.shape[:-1] + (b.shape[1],))
        if a.dtype == b.dtype == np.float16:
            # float32 accumulation, rounded once (MegEngine's compute_mode
            # "float32", PyTorch's and every BLAS's half GEMM); NumPy's float16
            # matmul rounds every partial sum to float16, and is slow
            return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
        if a.ndim == b.ndim == 2 and _OPENBLAS_ONE_THREAD < a.shape[0] * a.shape[1] * b.shape[1] < onednn.grain:
            # the thread policy's grain for NumPy's BLAS too: OpenBLAS splits a
            # product above 2^18 multiply-adds over its threads, whose spinning
            # after the join took a core from the demo (its training 2.3-2.9 s
            # against 0.9-1.9 s with OpenBLAS on one thread, load 6-9)
            with blas.single_threaded():
                return np.matmul(a, b)
        return np.matmul(a, b)

    def vjp(self, inputs, outputs, grads):
        (a, b), (g,) = inputs, grads
        mm = lambda x, y, ta=False, tb=False: _core.apply(MatrixMul(ta, tb), x, y)[0]
        ta, tb = self.transpose_a, self.transpose_b
        if not ta and not tb:
            return [mm(g, b, tb=True), mm(a, g, ta=True)]
        if ta and not tb:
            return [mm(b, g, tb=True), mm(a, g)]
        if not ta and tb:
            return [mm(g, b), mm(g, a, ta=True)]
        return [mm(b, g, True, True), mm(g, a, True, True)]

    def cuda(self, be, a, b):
        # the common case (float operands of the result's dtype, no broadcast
        # copy) is one cuBLAS call whose arguments depend only on the shapes:
        # planned once per signature
        plans = self.__dict__.get("_cuda_plans")        # ops are immutable: a cache beside the attributes
        if plans is None:
            plans = self.__dict__["_cuda_plans"] = {}
        key = (be, a.shape, a.dtype, b.shape, b.dtype)
        plan = plans.get(key, False)
        if plan is False:
            if len(plans) > 1024:
                plans.clear()
            plan = plans[key] = self._gemm_plan(a, b)
        if plan is None:
            return self._cuda_general(be, a, b)
        out_shape, dtype, args = plan
        c = be.empty(out_shape, dtype)
        ta, tb, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch = args
        be.gemm(tb, ta, n, m, k, 1.0, b.ptr, ldb, stride_b, a.ptr, lda, stride_a, 0.0, c.ptr, ldc, stride_c, batch,
                dtype)
        return c

    def _gemm_plan(self, a, b):
        """(output shape, dtype, ``gemm_rows``' arguments) when the product of
        arrays shaped and typed as ``a`` and ``b`` is one cuBLAS call on them
        as they are; None otherwise (``_cuda_general`` runs it)."""
        (out,) = self.infer_arrays(a, b)
        dtype, bs = out.dtype, out.shape[:-2]
        m, n = out.shape[-2:]
        k = a.shape[-2] if self.transpose_a else a.shape[-1]
        if dtype not in _BLAS_DTYPES or a.dtype != dtype or b.dtype != dtype or 0 in out.shape or k == 0:
            return None
        batch = int(math.prod(bs))
        sa, sb = (_batch_stride(x, bs) for x in (a, b))
        if sa is None or sb is None:            # a broadcast copy first
            return None
        if sb == 0 and sa and not self.transpose_a:
            m, batch = m * batch, 1      # one shared b: the batch is just more rows of a
        ta, tb = self.transpose_a, self.transpose_b
        lda, ldb, ldc = max(1, m if ta else k), max(1, k if tb else n), max(1, n)
        if max(m, n, k, lda, ldb, ldc, batch) > _INT32_MAX:
            return None                         # gemm_rows says why
        return tuple(out.shape), dtype, (ta, tb, m, n, k, lda, ldb, ldc, sa, sb, m * n, batch)

    def _cuda_general(self, be, a, b):
        (out,) = self.infer_arrays(a, b)
        dtype, bs = out.dtype, out.shape[:-2]
        m, n = out.shape[-2:]
        k = a.shape[-2] if self.transpose_a else a.shape[-1]
        check_cuda_dtype(self, dtype)
        if 0 in out.shape or k == 0:      # an empty sum is 0 (and cuBLAS needs k >= 1)
            return be.zeros(out.shape, dtype)
        a, sa = _batch_operand(be, be.cast(a, dtype), bs)
        b, sb = _batch_operand(be, be.cast(b, dtype), bs)
        batch = int(math.prod(bs))
        c = be.empty(out.shape, dtype)
        if dtype.kind in "iub":
            kernel = be.kernel(self, be.ctype(dtype), source=direct_matmul_source(be.ctype(dtype)))
            be.launch_n(kernel, c.size, a, b, c, m, n, k, batch, sa, sb,
                        np.int32(self.transpose_a), np.int32(self.transpose_b))
            return c
        if sb == 0 and sa and not self.transpose_a:
            m, batch = m * batch, 1      # one shared b: the batch is just more rows of a
        gemm_rows(be, dtype, m, n, k, a.ptr, b.ptr, c.ptr, ta=self.transpose_a, tb=self.transpose_b,
                  stride_a=sa, stride_b=sb, batch=batch)
        return c

    def cuda_source(self, ctype: str = "float") -> str:
        """The CUDA backend runs MatrixMul with cuBLAS (``gemmStridedBatched``:
        an operand with one matrix gets stride 0, other broadcast batch axes
        are materialised) and integer products on ``direct_matmul_source``;
        this source is the documented fallback for a build without cuBLAS
        (it needs real thread blocks: ``__syncthreads``, so the emulator
        cannot run it): a tiled batched GEMM
        ``gc_matmul_<ctype>(a, b, c, M, N, K, bs, as, bst)``.

        a, b, c contiguous; c of shape (*bs, M, N). ``bs`` is the output's
        batch shape, ``as``/``bst`` a's and b's element strides over those
        batch axes (right-aligned, 0 where an operand broadcasts). Launch:
        block (GC_TILE, GC_TILE), grid (ceil(N / GC_TILE), ceil(M / GC_TILE),
        min(batch, 65535)); the kernel loops over the batch with gridDim.z.
        """
        from .shape import _DIMS
        # c = op(a) @ op(b): a stored (M, K), or (K, M) when TA; b (K, N), or (N, K) when TB
        return Kernel("matmul", "const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, long long M, "
                      "long long N, long long K, gc_dims bs, gc_dims as, gc_dims bst", f"""
            const bool TA = {'true' if self.transpose_a else 'false'}, TB = {'true' if self.transpose_b else 'false'};
            __shared__ T As[GC_TILE][GC_TILE], Bs[GC_TILE][GC_TILE + 1];
            const int tx = threadIdx.x, ty = threadIdx.y;
            const long long i = blockIdx.y * (long long)GC_TILE + ty, j = blockIdx.x * (long long)GC_TILE + tx;
            long long batch = 1;
            for (int d = 0; d < bs.n; ++d) batch *= bs.d[d];
            for (long long z = blockIdx.z; z < batch; z += gridDim.z) {{
                long long t = z, ao = 0, bo = 0;
                for (int d = bs.n - 1; d >= 0; --d) {{
                    const long long q = t % bs.d[d]; t /= bs.d[d];
                    ao += q * as.d[d]; bo += q * bst.d[d];
                }}
                const T* A = a + ao; const T* B = b + bo;
                T acc = 0;
                for (long long k0 = 0; k0 < K; k0 += GC_TILE) {{
                    const long long ka = k0 + tx, kb = k0 + ty;
                    As[ty][tx] = (i < M && ka < K) ? (TA ? A[ka * M + i] : A[i * K + ka]) : (T)0;
                    Bs[ty][tx] = (kb < K && j < N) ? (TB ? B[j * K + kb] : B[kb * N + j]) : (T)0;
                    __syncthreads();
                    for (int kk = 0; kk < GC_TILE; ++kk) acc += As[ty][kk] * Bs[kk][tx];
                    __syncthreads();
                }}
                if (i < M && j < N) c[(z * M + i) * N + j] = acc;
            }}""").source(ctype, helpers=_DIMS + "#ifndef GC_TILE\n#define GC_TILE 16\n#endif\n")


_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_INT32_MAX = 2 ** 31 - 1


def check_cuda_dtype(op, dtype):
    """float16 and complex have no cuda kernels (nor cuBLAS GEMMs here): say
    so, as Elemwise does, instead of failing to compile a ``__half`` kernel."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype.kind == "c":
        raise TypeError(f"{op._name()}: cuda has no {dtype} kernels; cast the inputs to float32 or float64")


def _batch_stride(x, batch_shape):
    """``x``'s stride between matrices in a batched product over
    ``batch_shape`` (see ``_batch_operand``), or None when it needs a
    broadcast copy."""
    own = int(math.prod(x.shape[:-2]))
    if own == int(math.prod(batch_shape)):
        return x.shape[-2] * x.shape[-1]
    return 0 if own == 1 else None


def _batch_operand(be, x, batch_shape):
    """``x`` (*, r, c) ready for a batched product over ``batch_shape``, and
    its stride between matrices: its own when its batch is the whole batch
    (the same layout), 0 when it has one matrix, else broadcast out."""
    mat = x.shape[-2] * x.shape[-1]
    own = int(math.prod(x.shape[:-2]))
    if own == int(math.prod(batch_shape)):
        return x, mat
    if own == 1:
        return x, 0
    return be.broadcast_to(x, tuple(batch_shape) + x.shape[-2:]), mat


def gemm_rows(be, dtype, m, n, k, a, b, c, *, ta=False, tb=False, lda=None, ldb=None, ldc=None,
              stride_a=None, stride_b=None, stride_c=None, batch=1, beta=0.0):
    """``c[i] = op(a[i]) @ op(b[i]) + beta * c[i]`` for ``i < batch`` on row-major
    matrices through cuBLAS (``be.gemm``, column-major): op(a) is m x k
    (stored k x m when ``ta``), op(b) k x n (stored n x k when ``tb``), c
    m x n. ``a``, ``b``, ``c`` are device addresses; ``ld*`` the distance
    between a stored matrix's rows (default: contiguous), ``stride_*`` between
    the batch's matrices (0: the same matrix for all). Needs k >= 1.

    A row-major matrix is its transpose in column-major order, so C = A B is
    computed as C^T = B^T A^T: cuBLAS's A is our b, its B our a, m and n swap.
    """
    if not (m and n and batch):
        return
    lda = max(1, m if ta else k) if lda is None else lda
    ldb = max(1, k if tb else n) if ldb is None else ldb
    ldc = max(1, n) if ldc is None else ldc
    if max(m, n, k, lda, ldb, ldc, batch) > _INT32_MAX:
        raise ValueError(f"cuda matmul: a dimension exceeds cuBLAS's 32-bit limit (m={m}, n={n}, k={k}, "
                         f"batch={batch})")
    stride_a = m * k if stride_a is None else stride_a
    stride_b = k * n if stride_b is None else stride_b
    stride_c = m * n if stride_c is None else stride_c
    be.gemm(tb, ta, n, m, k, 1.0, b, ldb, stride_b, a, lda, stride_a, beta, c, ldc, stride_c, batch, dtype)


@functools.lru_cache(maxsize=None)      # built once per type: launchers ask on every call
def direct_matmul_source(ctype: str) -> str:
    """``gc_matmul_direct_<ctype>(a, b, c, M, N, K, batch, sa, sb, ta, tb)``:
    the products cuBLAS has no GEMM for (integers, bool), accumulated in the
    element type as NumPy does. c (batch, M, N) contiguous; a and b
    contiguous matrices ``sa``/``sb`` elements apart (0: one matrix for the
    whole batch), a stored (M, K) or (K, M) when ``ta``, b (K, N) or (N, K)
    when ``tb``. One thread per element of c (grid-stride loop)."""
    return _MATMUL_DIRECT.source(ctype)


_MATMUL_DIRECT = Kernel("matmul_direct", "const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, "
                        "long long M, long long N, long long K, long long batch, long long sa, long long sb, int ta, "
                        "int tb", """
    const long long j = idx % N, t = idx / N, i = t % M, z = t / M;
    const T* A = a + z * sa; const T* B = b + z * sb;
    T acc = 0;
    for (long long q = 0; q < K; ++q)
        acc = (T)(acc + (ta ? A[q * M + i] : A[i * K + q]) * (tb ? B[j * K + q] : B[q * N + j]));
    c[idx] = acc;""", over="total", setup="const long long total = batch * M * N;")


# one thread per matrix: Gauss-Jordan with partial pivoting on a copy of it
# (``work``), the inverse built in ``y`` from the identity (a singular matrix
# gives inf/NaN, as a division by its zero pivot does on the CPU's LAPACK path)
_MATINV = Kernel("matinv", "const T* __restrict__ x, T* __restrict__ work, T* __restrict__ y, long long batch, int n", """
    const long long nn = (long long)n * n;
    const T* a0 = x + b * nn;
    T* a = work + b * nn;
    T* v = y + b * nn;
    for (long long k = 0; k < nn; ++k) { a[k] = a0[k]; v[k] = (k / n == k % n) ? (T)1 : (T)0; }
    for (int c = 0; c < n; ++c) {
        int p = c;
        for (int r = c + 1; r < n; ++r)
            if (fabs(a[(long long)r * n + c]) > fabs(a[(long long)p * n + c])) p = r;
        if (p != c)
            for (int k = 0; k < n; ++k) {
                T t = a[(long long)c * n + k]; a[(long long)c * n + k] = a[(long long)p * n + k]; a[(long long)p * n + k] = t;
                t = v[(long long)c * n + k]; v[(long long)c * n + k] = v[(long long)p * n + k]; v[(long long)p * n + k] = t;
            }
        const T d = a[(long long)c * n + c];
        for (int k = 0; k < n; ++k) { a[(long long)c * n + k] /= d; v[(long long)c * n + k] /= d; }
        for (int r = 0; r < n; ++r) {
            if (r == c) continue;
            const T f = a[(long long)r * n + c];
            if (f == (T)0) continue;
            for (int k = 0; k < n; ++k) {
                a[(long long)r * n + k] -= f * a[(long long)c * n + k];
                v[(long long)r * n + k] -= f * v[(long long)c * n + k];
            }
        }
    }""", over="batch", index="b")


class MatrixInverse(Op):
    """The inverse of each (n, n) matrix over the last two axes (leading
    axes batch), MegEngine's ``F.matinv``. Its gradient is ``-y^T @ g @ y^T``
    (y the inverse), written with MatrixMul: every order follows."""
    name = "MatrixInverse"
    reduce_broadcast = False
    domain = (0.5, 1.5)          # (check_op's generated inputs; examples() gives invertible ones)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: well-conditioned matrices, one and batched."""
        rng = np.random.default_rng(0)
        return [(cls(), [rng.standard_normal((3, 3)) + 3 * np.eye(3)]),
                (cls(), [rng.standard_normal((2, 4, 4)) + 4 * np.eye(4)])]

    def infer(self, x):
        if x.dtype.kind != "f":
            raise self.error(f"needs a floating-point input, got {x.dtype}", x)
        if x.shape is not None and (len(x.shape) < 2 or x.shape[-1] != x.shape[-2]):
            raise self.error("needs square matrices over its last two axes (..., n, n)", x)
        return (TensorDesc(x.shape, x.dtype, x.device),)

    def cpu(self, x):
        if x.size == 0:
            return np.empty_like(x)
        with np.errstate(all="ignore"):
            try:
                return np.linalg.inv(x)
            except np.linalg.LinAlgError:      # singular: inf/NaN, as the GPU kernel gives
                return np.full_like(x, np.nan)

    def cuda(self, be, x):
        check_cuda_dtype(self, x.dtype)
        y = be.empty(x.shape, x.dtype)
        if x.size == 0:
            return y
        n = x.shape[-1]
        batch = x.size // (n * n)
        work = be.empty(x.shape, x.dtype)
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), batch, x, work, y, np.int64(batch), np.int32(n))
        return y

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_matinv_<ctype>(x, work, y, long long batch, int n)``: one
        thread per matrix (Gauss-Jordan with partial pivoting)."""
        return _MATINV.source(ctype)

    def vjp(self, inputs, outputs, grads):
        (y,), (g,) = outputs, grads
        gy = _core.apply(MatrixMul(transpose_a=True), y, g)[0]          # y^T @ g
        return [-_core.apply(MatrixMul(transpose_b=True), gy, y)[0]]    # ... @ y^T


# one thread per matrix: one-sided Jacobi (Hestenes) on W = A, or A^T when
# A is wide (p x q, p >= q), the rotations accumulated in V; singular values
# the column norms, sorted; the left vectors the normalised columns, completed
# to an orthonormal basis from the standard one where a column is zero or
# full_matrices asks for more; each left vector's largest entry made
# positive (with its right vector), as the cpu kernel does
_SVD = Kernel("svd", "const T* __restrict__ x, T* __restrict__ work, T* __restrict__ vbuf, T* __restrict__ u, "
              "T* __restrict__ s, T* __restrict__ vh, long long batch, int m, int n, int full", """
    const bool ge = m >= n;
    const int p = ge ? m : n, q = ge ? n : m;
    const int ku = full ? m : q, kv = full ? n : q, kl = ge ? ku : kv;
    const T* a = x + b * (long long)m * n;
    T* w = work + b * (long long)p * q;
    T* v = vbuf + b * (long long)q * q;
    T* uo = u + b * (long long)m * ku;
    T* so = s + b * (long long)q;
    T* vo = vh + b * (long long)kv * n;
    T* lo = ge ? uo : vo;       // the left vectors of W: U's columns, or Vh's rows
    auto left = [&](int i, int j) -> T& { return lo[ge ? (long long)i * kl + j : (long long)j * p + i]; };
    for (int i = 0; i < p; ++i)
        for (int j = 0; j < q; ++j) w[(long long)i * q + j] = ge ? a[(long long)i * n + j] : a[(long long)j * n + i];
    for (int i = 0; i < q; ++i)
        for (int j = 0; j < q; ++j) v[(long long)i * q + j] = (i == j) ? (T)1 : (T)0;
    const T eps = sizeof(T) == 4 ? (T)1e-7 : (T)1e-15;
    for (int sweep = 0; sweep < 80; ++sweep) {
        bool rotated = false;
        for (int j = 0; j + 1 < q; ++j)
            for (int l = j + 1; l < q; ++l) {
                T al = 0, be = 0, ga = 0;
                for (int i = 0; i < p; ++i) {
                    const T x1 = w[(long long)i * q + j], x2 = w[(long long)i * q + l];
                    al += x1 * x1; be += x2 * x2; ga += x1 * x2;
                }
                if (ga == (T)0 || fabs(ga) <= eps * sqrt(al * be)) continue;
                rotated = true;
                const T zeta = (be - al) / (2 * ga);
                const T t = (zeta >= 0 ? (T)1 : (T)-1) / (fabs(zeta) + sqrt(1 + zeta * zeta));
                const T c = 1 / sqrt(1 + t * t), sn = c * t;
                for (int i = 0; i < p; ++i) {
                    const T x1 = w[(long long)i * q + j], x2 = w[(long long)i * q + l];
                    w[(long long)i * q + j] = c * x1 - sn * x2; w[(long long)i * q + l] = sn * x1 + c * x2;
                }
                for (int i = 0; i < q; ++i) {
                    const T x1 = v[(long long)i * q + j], x2 = v[(long long)i * q + l];
                    v[(long long)i * q + j] = c * x1 - sn * x2; v[(long long)i * q + l] = sn * x1 + c * x2;
                }
            }
        if (!rotated) break;
    }
    for (int j = 0; j < q; ++j) {
        T acc = 0;
        for (int i = 0; i < p; ++i) acc += w[(long long)i * q + j] * w[(long long)i * q + j];
        so[j] = sqrt(acc);
    }
    for (int j = 0; j < q; ++j) {          // descending: selection sort, columns along
        int best = j;
        for (int l = j + 1; l < q; ++l) if (so[l] > so[best]) best = l;
        if (best == j) continue;
        T t = so[j]; so[j] = so[best]; so[best] = t;
        for (int i = 0; i < p; ++i) { t = w[(long long)i * q + j]; w[(long long)i * q + j] = w[(long long)i * q + best]; w[(long long)i * q + best] = t; }
        for (int i = 0; i < q; ++i) { t = v[(long long)i * q + j]; v[(long long)i * q + j] = v[(long long)i * q + best]; v[(long long)i * q + best] = t; }
    }
    int r = 0;
    for (int j = 0; j < q; ++j) {
        if (!(so[j] > 0)) break;
        for (int i = 0; i < p; ++i) left(i, j) = w[(long long)i * q + j] / so[j];
        r = j + 1;
    }
    for (int j = r; j < kl; ++j) {         // complete: the standard vector least inside the span so far
        int best = 0; T best_norm = -1;
        for (int pass = 0; pass < 2; ++pass) {
            for (int t = (pass ? best : 0); t < (pass ? best + 1 : p); ++t) {
                for (int i = 0; i < p; ++i) left(i, j) = (i == t) ? (T)1 : (T)0;
                for (int twice = 0; twice < 2; ++twice)
                    for (int c = 0; c < j; ++c) {
                        T dot = 0;
                        for (int i = 0; i < p; ++i)
                            dot += left(i, c) * left(i, j);
                        for (int i = 0; i < p; ++i)
                            left(i, j) -= dot * left(i, c);
                    }
                T nrm = 0;
                for (int i = 0; i < p; ++i) nrm += left(i, j) * left(i, j);
                nrm = sqrt(nrm);
                if (!pass && nrm > best_norm) { best_norm = nrm; best = t; }
                if (pass) for (int i = 0; i < p; ++i) left(i, j) /= nrm;
            }
        }
    }
    for (int i = 0; i < q; ++i)            // the right vectors: Vh = V^T, or U = V
        for (int j = 0; j < q; ++j) {
            if (ge) vo[(long long)j * n + i] = v[(long long)i * q + j];
            else uo[(long long)i * ku + j] = v[(long long)i * q + j];
        }
    const int ncols = ku > kv ? ku : kv;   // signs: each U column's largest entry positive (first if tied)
    for (int j = 0; j < ncols; ++j) {
        const bool has_u = j < ku, has_v = j < kv;
        int at = 0; T big = -1;
        if (has_u) { for (int i = 0; i < m; ++i) if (fabs(uo[(long long)i * ku + j]) > big) { big = fabs(uo[(long long)i * ku + j]); at = i; } }
        else { for (int i = 0; i < n; ++i) if (fabs(vo[(long long)j * n + i]) > big) { big = fabs(vo[(long long)j * n + i]); at = i; } }
        const bool flip = has_u ? uo[(long long)at * ku + j] < 0 : vo[(long long)j * n + at] < 0;
        if (!flip) continue;
        if (has_u) for (int i = 0; i < m; ++i) uo[(long long)i * ku + j] = -uo[(long long)i * ku + j];
        if (has_v && (j < q || !has_u)) for (int i = 0; i < n; ++i) vo[(long long)j * n + i] = -vo[(long long)j * n + i];
    }""", over="batch", index="b")


def canonical_signs(u: np.ndarray, vh: np.ndarray) -> None:
    """Flip singular vector pairs in place so that each column of ``u`` has
    its largest entry (the first of equal ones) positive; a row of ``vh``
    with no column of ``u`` (a full, wide ``vh``) by its own largest entry.

    Example::

        >>> u, vh = np.array([[-1.0]]), np.array([[-1.0]]); canonical_signs(u, vh); u.tolist()
        [[1.0]]
    """
    ku, kv = u.shape[-1], vh.shape[-2]
    k = min(ku, kv)
    if ku:
        cols = np.take_along_axis(u, np.abs(u).argmax(-2)[..., None, :], -2)[..., 0, :] < 0   # (..., ku)
        u *= np.where(cols, -1, 1)[..., None, :]
        vh[..., :k, :] *= np.where(cols[..., :k], -1, 1)[..., :, None]
    if kv > ku:
        rows = np.take_along_axis(vh[..., ku:, :], np.abs(vh[..., ku:, :]).argmax(-1)[..., :, None], -1)[..., 0] < 0
        vh[..., ku:, :] *= np.where(rows, -1, 1)[..., :, None]


class SVD(Op):
    """The singular value decomposition of each (M, N) matrix over the last
    two axes: (U, S, Vh) with ``x = U @ diag(S) @ Vh``, S descending,
    MegEngine's ``F.svd``; U (..., M, K) and Vh (..., K, N) for K = min(M,
    N), or (..., M, M) and (..., N, N) with ``full_matrices``. Singular
    vectors are unique only up to sign: each column of U has its largest
    entry positive, on both devices. Gradient (reduced form, Townsend's
    formula written with MatrixMul and elementwise ops: every order follows;
    undefined where singular values repeat or, for U and Vh, are zero)."""
    name = "SVD"
    reduce_broadcast = False
    attrs = ("full_matrices",)
    check_params = ({"full_matrices": False},)

    def __init__(self, full_matrices: bool = False):
        self.full_matrices = bool(full_matrices)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: tall, wide and batched
        matrices (the reduced form: full matrices have no gradient; tests/ops/test_svd.py
        checks their values on both devices)."""
        rng = np.random.default_rng(0)
        return [(cls(), [rng.standard_normal((4, 3))]), (cls(), [rng.standard_normal((2, 3, 5))])]

    def infer(self, x):
        if x.dtype.kind != "f":
            raise self.error(f"needs a floating-point input, got {x.dtype}", x)
        if x.shape is not None and len(x.shape) < 2:
            raise self.error("needs matrices over its last two axes (..., M, N)", x)
        if x.shape is None:
            return tuple(TensorDesc(None, x.dtype, x.device) for _ in range(3))
        *lead, m, n = x.shape
        k = min(m, n)
        ku, kv = (m, n) if self.full_matrices else (k, k)
        return (TensorDesc((*lead, m, ku), x.dtype, x.device), TensorDesc((*lead, k), x.dtype, x.device),
                TensorDesc((*lead, kv, n), x.dtype, x.device))

    def cpu(self, x):
        u_d, s_d, vh_d = self.infer(TensorDesc(x.shape, x.dtype))
        if x.size == 0:
            return (np.zeros(u_d.shape, x.dtype), np.zeros(s_d.shape, x.dtype), np.zeros(vh_d.shape, x.dtype))
        with np.errstate(all="ignore"):
            try:
                u, s, vh = np.linalg.svd(x, full_matrices=self.full_matrices)
            except np.linalg.LinAlgError:           # inf or NaN in x
                return (np.full(u_d.shape, np.nan, x.dtype), np.full(s_d.shape, np.nan, x.dtype),
                        np.full(vh_d.shape, np.nan, x.dtype))
        u, vh = np.ascontiguousarray(u), np.ascontiguousarray(vh)
        canonical_signs(u, vh)
        return u, s, vh

    def cuda(self, be, x):
        check_cuda_dtype(self, x.dtype)
        u_d, s_d, vh_d = self.infer_arrays(x)
        u, s, vh = be.empty(u_d.shape, x.dtype), be.empty(s_d.shape, x.dtype), be.empty(vh_d.shape, x.dtype)
        m, n = x.shape[-2:]
        batch = int(np.prod(x.shape[:-2], dtype=np.int64))
        if batch == 0 or m == 0 or n == 0:
            return u, s, vh
        p, q = max(m, n), min(m, n)
        work, vbuf = be.empty((batch, p, q), x.dtype), be.empty((batch, q, q), x.dtype)
        be.launch_n(be.kernel(self, be.ctype(x.dtype)), batch, x, work, vbuf, u, s, vh, np.int64(batch),
                    np.int32(m), np.int32(n), np.int32(self.full_matrices))
        return u, s, vh

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_svd_<ctype>(x, work, vbuf, u, s, vh, long long batch, int m,
        int n, int full)``: one thread per matrix (one-sided Jacobi)."""
        return _SVD.source(ctype)

    def vjp(self, inputs, outputs, grads):
        if self.full_matrices:
            raise _core.NotDifferentiableError(
                "SVD(full_matrices=True): the extra singular vectors are not unique, so it has no gradient; "
                "differentiate the reduced form (full_matrices=False), as PyTorch does")
        (u, s, vh), (gu, gs, gvh) = outputs, grads

        def mm(a, b, ta=False, tb=False):
            return _core.apply(MatrixMul(transpose_a=ta, transpose_b=tb), a, b)[0]

        def col(a):     # (..., k) -> (..., 1, k): multiplying scales columns
            return _core.apply(ExpandDims(-2), a)[0]

        def row(a):     # (..., k) -> (..., k, 1): multiplying scales rows
            return _core.apply(ExpandDims(-1), a)[0]

        def where(c, a, b):
            return _core.apply(Elemwise("where"), c, a, b)[0]
        s2 = s * s
        d = col(s2) - row(s2)                               # d[i, j] = s_j^2 - s_i^2
        zero = _core.apply(Elemwise("eq"), d, 0)[0]
        f = where(zero, 0, 1 / where(zero, 1, d))           # 0 on the diagonal
        j = f * (mm(u, gu, ta=True) - mm(gu, u, ta=True))        # F o (U^T gU - gU^T U)
        k = f * (mm(vh, gvh, tb=True) - mm(gvh, vh, tb=True))    # F o (V^T gV - gV^T V)
        ga = mm(mm(u, j * col(s) + row(s) * k) + u * col(gs), vh)
        gu_s = gu / col(s)                                  # gU S^-1
        ga = ga + mm(gu_s - mm(u, mm(u, gu_s, ta=True)), vh)          # (I - U U^T) gU S^-1 Vh
        sgvh = gvh / row(s)                                 # S^-1 gVh
        ga = ga + mm(u, sgvh - mm(mm(sgvh, vh, tb=True), vh))          # U S^-1 gVh (I - V V^T)
        return [ga]
