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
