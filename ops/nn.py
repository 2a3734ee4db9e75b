"""Neural-network ops: log_softmax (hand VJP: it needs only its output),
logsumexp (declared by decomposition only: its backward graph is derived)."""
from __future__ import annotations

import math

import numpy as np

from gradcore import _core, dtypes
from gradcore.op import Composite, Op, TensorDesc

from .elemwise import Elemwise
from .linalg import check_cuda_dtype
from .reduce import BLOCK_REDUCE, MAX_BLOCKS, SHORT_AXIS, Reduce, op_int, row_threads
from .shape import StopGradient


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def _float_inputs(op, in_dtypes):
    """``input_dtypes`` of ops that must produce floats (gradcore.dtypes):
    integer and bool inputs are computed in float32."""
    return op, tuple(dtypes.float_dtype(d) for d in in_dtypes)


def _check_axis(op, x):
    if x.shape is not None and not -max(x.ndim, 1) <= op.axis < max(x.ndim, 1):
        raise op.error(f"axis {op.axis} is out of range for {x.ndim} dimensions", x)


class LogSoftmax(Op):
    name = "LogSoftmax"
    attrs = ("axis",)

    def __init__(self, axis=-1):
        self.axis = op_int("LogSoftmax", "axis", axis)
        self._seal()

    input_dtypes = _float_inputs

    def infer(self, x):
        _check_axis(self, x)
        if x.dtype.kind in "biu":
            # the kernels take integers, promoted as NumPy's exp promotes them
            return (TensorDesc(x.shape, np.exp(np.zeros(0, x.dtype)).dtype, x.device),)
        if x.dtype.kind not in "fc":
            raise self.error(f"needs a floating-point input, got {x.dtype}", x)
        return (x,)

    def cpu(self, x):
        if x.size == 0:       # nothing to normalise (NumPy's max refuses an empty axis)
            return np.empty_like(x)
        m = np.max(x, axis=self.axis, keepdims=True)
        z = x - m
        return z - np.log(np.sum(np.exp(z), axis=self.axis, keepdims=True))

    def vjp(self, inputs, outputs, grads):
        (x,), (out,), (g,) = inputs, outputs, grads
        s = _apply1(Reduce("sum", self.axis, True), g)
        return [g - _apply1(Elemwise("exp"), out) * s]

    def decompose(self, x):
        return x - _apply1(LogSumExp(self.axis, True), x)

    def cuda(self, be, x):
        return _launch_rows(self, be, x)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_log_softmax_<ctype>(x, y, outer, n, inner)``: x and y
        contiguous, viewed as (outer, n, inner) around the axis; one thread
        per row (outer * inner of them, adjacent threads on adjacent
        columns): a max pass, a sum-exp pass, a write. And
        ``gc_log_softmax_rows_<ctype>(x, y, rows, n)`` for inner 1: a block
        per row, its threads striding over the row, the max and the sum
        block reductions."""
        return _row_source("log_softmax", ctype)


class Softmax(Op):
    """exp(x) / sum(exp(x)) along ``axis``. Declared by decomposition
    (``exp(log_softmax(x))``) too, but its hand VJP is measurably better: it
    reads only the output, where the derived graph recomputes from x."""
    name = "Softmax"
    attrs = ("axis",)

    def __init__(self, axis=-1):
        self.axis = op_int("Softmax", "axis", axis)
        self._seal()

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: last and first axis."""
        rng = np.random.default_rng(0)
        return [(cls(-1), [rng.standard_normal((2, 3))]), (cls(0), [rng.standard_normal((3, 2))])]

    infer = LogSoftmax.infer      # same checks: an axis, a floating-point input
    input_dtypes = _float_inputs

    def cpu(self, x):
        if x.size == 0:       # nothing to normalise (NumPy's max refuses an empty axis)
            return np.empty_like(x)
        e = np.exp(x - np.max(x, axis=self.axis, keepdims=True))
        e /= np.sum(e, axis=self.axis, keepdims=True)
        return e

    def vjp(self, inputs, outputs, grads):
        (y,), (g,) = outputs, grads
        gy = g * y
        return [gy - y * _apply1(Reduce("sum", self.axis, True), gy)]

    def decompose(self, x):
        return _apply1(Elemwise("exp"), _apply1(LogSoftmax(self.axis), x))

    def cuda(self, be, x):
        return _launch_rows(self, be, x)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_softmax_<ctype>(x, y, outer, n, inner)`` and
        ``gc_softmax_rows_<ctype>(x, y, rows, n)``: as log_softmax."""
        return _row_source("softmax", ctype)


class LogSumExp(Composite):
    """log(sum(exp(x), axis)): forward and backward both come from the
    decomposition below."""
    name = "LogSumExp"
    attrs = ("axis", "keepdims")

    def __init__(self, axis=-1, keepdims=False):
        self.axis, self.keepdims = op_int("LogSumExp", "axis", axis), bool(keepdims)
        self._seal()

    input_dtypes = _float_inputs

    def infer(self, x):
        _check_axis(self, x)      # named after this op, not the Reduce inside
        return super().infer(x)

    def decompose(self, x):
        m = _apply1(StopGradient(), _apply1(Reduce("max", self.axis, True), x))
        # an infinite max would make x - m NaN; shifting by 0 instead gives
        # -inf for a row of -inf and inf for a row holding inf (as PyTorch)
        m = _apply1(Elemwise("where"), _apply1(Elemwise("eq"), _apply1(Elemwise("abs"), m), math.inf), 0, m)
        s = _apply1(Reduce("sum", self.axis, True), _apply1(Elemwise("exp"), x - m))
        out = _apply1(Elemwise("log"), s) + m
        if not self.keepdims and x.ndim != 0:      # a 0-d x has no axis to squeeze
            from .shape import Squeeze
            out = _apply1(Squeeze(self.axis), out)
        return out

    def cuda(self, be, x):
        # the fused kernel runs the forward; the backward is still derived
        # from the decomposition (its ops run on cuda one by one)
        return _launch_rows(self, be, x)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_logsumexp_<ctype>(x, y, outer, n, inner)``: a fused kernel for
        the decomposition; x contiguous, viewed as (outer, n, inner) around
        the axis; y: outer * inner (keepdims or not); one thread per row. And
        ``gc_logsumexp_rows_<ctype>(x, y, rows, n)`` for inner 1: a block
        per row."""
        return _row_source("logsumexp", ctype)


# per kernel: (what a row's max becomes, the write of a thread per row, the
# write of a block per row)
_ROW_KINDS = {
    "log_softmax": ("m", "for (long long k = 0; k < n; ++k) y[base + k * inner] = (p[k * inner] - m) - ls;",
                    "for (long long k = threadIdx.x; k < n; k += blockDim.x) y[base + k] = (p[k] - m) - ls;"),
    "softmax": ("m", "for (long long k = 0; k < n; ++k) y[base + k * inner] = exp((p[k * inner] - m) - ls);",
                "for (long long k = threadIdx.x; k < n; k += blockDim.x) y[base + k] = exp((p[k] - m) - ls);"),
    # as the decomposition: no inf - inf
    "logsumexp": ("isinf(m) ? 0 : m", "y[idx] = ls + m;", "if (threadIdx.x == 0) y[idx] = ls + m;"),
}
_ROW_NAMES = {"LogSoftmax": "log_softmax", "Softmax": "softmax", "LogSumExp": "logsumexp"}


def _row_source(kind: str, T: str, per: str = "both") -> str:
    """The two kernels of a row op (softmax, log_softmax, logsumexp), or
    (``per`` "thread" / "block") one of them, as the source of a module of
    its own (the host emulator runs the first in one pass, without fibers):
    a thread per row (``gc_<kind>_<T>``, any inner) and a block per row
    (``gc_<kind>_rows_<T>``, inner 1). Each: m = the row's max, s =
    sum(exp(x - m)), ls = log(s), then the write."""
    if per == "both":
        return _row_source(kind, T, "thread") + _row_source(kind, T, "block")
    shift, thread_write, block_write = _ROW_KINDS[kind]
    if per == "thread":
        return (f'extern "C" __global__ void gc_{kind}_{_cname(T)}(const {T}* __restrict__ x, '
                f"{T}* __restrict__ y, long long outer, long long n, long long inner)\n{{\n"
                "    const long long total = outer * inner;\n"
                "    if (n <= 0) return;\n" + _ROWS +
                "        const long long base = (idx / inner) * n * inner + idx % inner;\n"
                f"        const {T}* p = x + base;\n"
                f"        {T} m = p[0], s = 0;\n"
                "        for (long long k = 1; k < n; ++k) m = p[k * inner] > m ? p[k * inner] : m;\n"
                f"        m = {shift};\n"
                "        for (long long k = 0; k < n; ++k) s += exp(p[k * inner] - m);\n"
                f"        const {T} ls = log(s);\n"
                f"        {thread_write}\n"
                "    }\n}\n")
    return (BLOCK_REDUCE +
            f'extern "C" __global__ void gc_{kind}_rows_{_cname(T)}(const {T}* __restrict__ x, '
            f"{T}* __restrict__ y, long long rows, long long n)\n{{\n"
            f"    __shared__ {T} scratch[32];\n"
            "    if (n <= 0) return;\n"
            "    for (long long idx = blockIdx.x; idx < rows; idx += gridDim.x) {   // uniform per block\n"
            "        const long long base = idx * n;\n"
            f"        const {T}* p = x + base;\n"
            f"        {T} m = p[0], s = 0;\n"
            "        for (long long k = threadIdx.x; k < n; k += blockDim.x) m = p[k] > m ? p[k] : m;\n"
            "        m = gc_block_reduce(m, scratch, gc_op_max());\n"
            f"        m = {shift};\n"
            "        for (long long k = threadIdx.x; k < n; k += blockDim.x) s += exp(p[k] - m);\n"
            "        s = gc_block_reduce(s, scratch, gc_op_sum());\n"
            f"        const {T} ls = log(s);\n"
            f"        {block_write}\n"
            "    }\n}\n")


def _launch_rows(op, be, x):
    """Run ``op``'s row kernel (x viewed as (outer, n, inner) around
    ``op.axis``: a block per row when inner is 1, else a thread per row)
    into a new array of the inferred shape."""
    # the CPU kernels take integers too (exp promotes them as NumPy does); so
    # does this, past infer's check (which also rejects a bad axis, and
    # LogSumExp over an empty axis, as the CPU does)
    dtype = x.dtype if x.dtype.kind in "fc" else np.exp(np.zeros(0, x.dtype)).dtype
    (out,) = op.infer(TensorDesc(x.shape, dtype, "cuda"))
    check_cuda_dtype(op, out.dtype)
    x = be.cast(x, out.dtype)
    y = be.empty(out.shape, out.dtype)
    axis = op.axis % max(x.ndim, 1)
    outer = int(math.prod(x.shape[:axis]))
    n = x.shape[axis] if x.ndim else 1
    inner = int(math.prod(x.shape[axis + 1:]))
    ctype = be.ctype(x.dtype)
    kind, c = _ROW_NAMES[op.name], _cname(ctype)
    if outer * inner == 0:
        return y
    if inner == 1 and n > SHORT_AXIS:    # a block per row
        be.launch(be.kernel(op, ctype, source=_row_source(kind, ctype, "block")), (min(outer, MAX_BLOCKS),),
                  (row_threads(n),), x, y, outer, n)
    else:                           # a thread per row (adjacent threads on adjacent columns)
        be.launch_n(be.kernel(op, ctype, source=_row_source(kind, ctype, "thread")), outer * inner, x, y, outer, n,
                    inner)
    return y


# grid-stride loop of the CUDA kernels above: one thread per row
_ROWS = ("    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;\n"
         "         idx += (long long)blockDim.x * gridDim.x) {\n")


def _cname(ctype):
    return ctype.replace(" ", "_")
