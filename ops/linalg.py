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


# OpenBLAS runs a GEMM of up to this many multiply-adds on one thread by itself
# (its SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD)
_OPENBLAS_ONE_THREAD = 1 << 18


class MatrixMul(Op):
    """Batched ``a @ b`` over the last two axes (leading axes broadcast),
    with optional transposition of either operand."""
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
