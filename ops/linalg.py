"""Linear algebra: batched matrix multiplication."""
from __future__ import annotations

import numpy as np

from gradcore import _core
from gradcore.op import Op, TensorDesc


class MatrixMul(Op):
    """Batched ``a @ b`` over the last two axes (leading axes broadcast),
    with optional transposition of either operand."""
    name = "MatrixMul"
    attrs = ("transpose_a", "transpose_b")
    reduce_broadcast = True   # batch axes broadcast: grads are summed down centrally

    def __init__(self, transpose_a: bool = False, transpose_b: bool = False):
        self.transpose_a, self.transpose_b = bool(transpose_a), bool(transpose_b)
        self._seal()

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: plain, transposed and batched."""
        rng = np.random.default_rng(0)
        return [(cls(), [rng.standard_normal((2, 3)), rng.standard_normal((3, 4))]),
                (cls(False, True), [rng.standard_normal((2, 2, 3)), rng.standard_normal((4, 3))])]

    def infer(self, a, b):
        dtype = np.result_type(a.dtype, b.dtype)
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

    def cuda_source(self, ctype: str = "float") -> str:
        """The CUDA backend runs MatrixMul with cuBLAS (``gemmStridedBatched``,
        or one GEMM per batch offset when the batch axes broadcast); this
        source is the fallback, for ctypes cuBLAS lacks or without cuBLAS: a
        tiled batched GEMM ``gc_matmul_<ctype>(a, b, c, M, N, K, bs, as, bst)``.

        a, b, c contiguous; c of shape (*bs, M, N). ``bs`` is the output's
        batch shape, ``as``/``bst`` a's and b's element strides over those
        batch axes (right-aligned, 0 where an operand broadcasts). Launch:
        block (GC_TILE, GC_TILE), grid (ceil(N / GC_TILE), ceil(M / GC_TILE),
        min(batch, 65535)); the kernel loops over the batch with gridDim.z.
        """
        T = ctype
        from .indexing import _DIMS
        return (_DIMS + "#ifndef GC_TILE\n#define GC_TILE 16\n#endif\n"
                f'extern "C" __global__ void gc_matmul_{T.replace(" ", "_")}(const {T}* __restrict__ a, '
                f"const {T}* __restrict__ b, {T}* __restrict__ c, long long M, long long N, long long K, "
                "gc_dims bs, gc_dims as, gc_dims bst)\n{\n"
                "    // c = op(a) @ op(b): a stored (M, K), or (K, M) when TA; b (K, N), or (N, K) when TB\n"
                f"    const bool TA = {'true' if self.transpose_a else 'false'}, "
                f"TB = {'true' if self.transpose_b else 'false'};\n"
                f"    __shared__ {T} As[GC_TILE][GC_TILE], Bs[GC_TILE][GC_TILE + 1];\n"
                "    const int tx = threadIdx.x, ty = threadIdx.y;\n"
                "    const long long i = blockIdx.y * (long long)GC_TILE + ty, j = blockIdx.x * (long long)GC_TILE + tx;\n"
                "    long long batch = 1;\n"
                "    for (int d = 0; d < bs.n; ++d) batch *= bs.d[d];\n"
                "    for (long long z = blockIdx.z; z < batch; z += gridDim.z) {\n"
                "        long long t = z, ao = 0, bo = 0;\n"
                "        for (int d = bs.n - 1; d >= 0; --d) {\n"
                "            const long long q = t % bs.d[d]; t /= bs.d[d];\n"
                "            ao += q * as.d[d]; bo += q * bst.d[d];\n"
                "        }\n"
                f"        const {T}* A = a + ao; const {T}* B = b + bo;\n"
                f"        {T} acc = 0;\n"
                "        for (long long k0 = 0; k0 < K; k0 += GC_TILE) {\n"
                "            const long long ka = k0 + tx, kb = k0 + ty;\n"
                f"            As[ty][tx] = (i < M && ka < K) ? (TA ? A[ka * M + i] : A[i * K + ka]) : ({T})0;\n"
                f"            Bs[ty][tx] = (kb < K && j < N) ? (TB ? B[j * K + kb] : B[kb * N + j]) : ({T})0;\n"
                "            __syncthreads();\n"
                "            for (int kk = 0; kk < GC_TILE; ++kk) acc += As[ty][kk] * Bs[kk][tx];\n"
                "            __syncthreads();\n"
                "        }\n"
                "        if (i < M && j < N) c[(z * M + i) * N + j] = acc;\n"
                "    }\n}\n")
