"""Neural-network ops: log_softmax (hand VJP: it needs only its output),
logsumexp (declared by decomposition only: its backward graph is derived),
batch normalisation (training, its backward, inference: cuDNN on a GPU),
standardisation over some axes (layer, group and general norm), with the
affine scale and shift in the same op (layer and group norm)."""
from __future__ import annotations

import functools
import math

import numpy as np

from gradcore import _core, dtypes
from gradcore.cpu import _kernels as _fast, onednn
from gradcore.cuda import cudnn
from gradcore.cuda.kernels import Kernel, kernel_name, source
from gradcore.op import Composite, Op, TensorDesc

from .elemwise import Elemwise
from .linalg import check_cuda_dtype
from .reduce import BLOCK_REDUCE, MAX_BLOCKS, SHORT_AXIS, BroadcastBack, Reduce, op_int, row_threads
from .shape import StopGradient, SumToLike, ZerosLike


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
    """log(softmax(x)) along ``axis``.

    Example::

        >>> from gradcore.functional import LogSoftmax
        >>> y, = gc.core.apply(LogSoftmax(axis=-1), gc.tensor([0.0, 0.0]))
        >>> y.numpy().round(4)
        array([-0.6931, -0.6931], dtype=float32)
    """

    name = "LogSoftmax"
    reduce_broadcast = False
    attrs = ("axis",)

    def __init__(self, axis=-1):
        self.axis = op_int("LogSoftmax", "axis", axis)

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
        z = np.subtract(x, np.max(x, axis=self.axis, keepdims=True))
        ls = np.log(np.sum(np.exp(z), axis=self.axis, keepdims=True))
        if isinstance(z, np.ndarray) and z.dtype == ls.dtype:
            z -= ls               # in place in the buffer this kernel owns
            return z
        return z - ls             # a 0-d result, or integers (log makes floats)

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
    reads only the output, where the derived graph recomputes from x.

    Example::

        >>> from gradcore.functional import Softmax
        >>> y, = gc.core.apply(Softmax(axis=-1), gc.tensor([0.0, np.log(3.0)]))
        >>> y.numpy()
        array([0.25, 0.75], dtype=float32)
    """
    name = "Softmax"
    reduce_broadcast = False
    attrs = ("axis",)

    def __init__(self, axis=-1):
        self.axis = op_int("Softmax", "axis", axis)

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
        e = np.subtract(x, np.max(x, axis=self.axis, keepdims=True))
        if isinstance(e, np.ndarray) and e.dtype.kind == "f":
            np.exp(e, out=e)      # in place: one allocation fewer
        else:                     # a 0-d result (a NumPy scalar) or integers: exp makes floats
            e = np.exp(e)
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
    decomposition below.

    Example::

        >>> from gradcore.functional import LogSumExp
        >>> y, = gc.core.apply(LogSumExp(axis=-1), gc.tensor([[0.0, 0.0]]))
        >>> y.numpy().round(4)
        array([0.6931], dtype=float32)
    """
    name = "LogSumExp"
    attrs = ("axis", "keepdims")

    def __init__(self, axis=-1, keepdims=False):
        self.axis, self.keepdims = op_int("LogSumExp", "axis", axis), bool(keepdims)

    input_dtypes = _float_inputs

    def infer(self, x):
        _check_axis(self, x)      # named after this op, not the Reduce inside
        if x.shape is not None and x.ndim and x.shape[self.axis] == 0:
            raise self.error(f"cannot take logsumexp over an empty dimension (axis {self.axis})", x)
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


@functools.lru_cache(maxsize=None)      # built once per kind and type: launchers ask on every call
def _row_source(kind: str, ctype: str, per: str = "both") -> str:
    """The two kernels of a row op (softmax, log_softmax, logsumexp), or
    (``per`` "thread" / "block") one of them, as the source of a module of
    its own (the host emulator runs the first in one pass, without fibers):
    a thread per row (``gc_<kind>_<ctype>``, any inner) and a block per row
    (``gc_<kind>_rows_<ctype>``, inner 1). Each: m = the row's max, s =
    sum(exp(x - m)), ls = log(s), then the write."""
    if per == "both":
        return _row_source(kind, ctype, "thread") + _row_source(kind, ctype, "block")
    shift, thread_write, block_write = _ROW_KINDS[kind]
    if per == "thread":
        return Kernel(kind, "const T* __restrict__ x, T* __restrict__ y, long long outer, long long n, long long inner",
                      f"""
            const long long base = (idx / inner) * n * inner + idx % inner;
            const T* p = x + base;
            T m = p[0], s = 0;
            for (long long k = 1; k < n; ++k) m = p[k * inner] > m ? p[k * inner] : m;
            m = {shift};
            for (long long k = 0; k < n; ++k) s += exp(p[k * inner] - m);
            const T ls = log(s);
            {thread_write}""", over="total", setup="""
            const long long total = outer * inner;
            if (n <= 0) return;""").source(ctype)
    return Kernel(f"{kind}_rows", "const T* __restrict__ x, T* __restrict__ y, long long rows, long long n", f"""
        const long long base = idx * n;
        const T* p = x + base;
        T m = p[0], s = 0;
        for (long long k = threadIdx.x; k < n; k += blockDim.x) m = p[k] > m ? p[k] : m;
        m = gc_block_reduce(m, scratch, gc_op_max());
        m = {shift};
        for (long long k = threadIdx.x; k < n; k += blockDim.x) s += exp(p[k] - m);
        s = gc_block_reduce(s, scratch, gc_op_sum());
        const T ls = log(s);
        {block_write}""", over="rows", per="block", setup="""
        __shared__ T scratch[32];
        if (n <= 0) return;""").source(ctype, helpers=BLOCK_REDUCE)


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
    kind = _ROW_NAMES[op.name]
    if outer * inner == 0:
        return y
    if inner == 1 and n > SHORT_AXIS:    # a block per row
        be.launch(be.kernel(op, ctype, source=_row_source(kind, ctype, "block")), (min(outer, MAX_BLOCKS),),
                  (row_threads(n),), x, y, outer, n)
    else:                           # a thread per row (adjacent threads on adjacent columns)
        be.launch_n(be.kernel(op, ctype, source=_row_source(kind, ctype, "thread")), outer * inner, x, y, outer, n,
                    inner)
    return y


def _one_backward(backward, grads, likes, saved, n_in: int) -> list:
    """The vjp of an op whose every output's gradient goes into its one
    backward op ``backward`` (then ``saved``): None for each of its
    ``n_in`` inputs when there is no gradient, a missing one zero-filled
    like the output (``likes``) it stands for."""
    if all(g is None for g in grads):
        return [None] * n_in
    grads = [_apply1(ZerosLike(), like) if g is None else g for g, like in zip(grads, likes)]
    return list(_core.apply(backward, *grads, *saved))


# ---------------------------------------------------------------- standardisation
class _Standardize(Composite):
    """``axes`` (non-negative, sorted) and ``eps``; the statistics keep dims."""
    attrs = ("axes", "eps")

    def __init__(self, axes, eps=1e-5):
        self.axes = tuple(sorted(op_int(self.name, "axes", a) for a in axes))
        if not self.axes or self.axes[0] < 0 or len(set(self.axes)) != len(self.axes):
            raise ValueError(f"{self.name}: axes must be distinct non-negative axes, got {axes!r}")
        self.eps = float(eps)
        self._mean = Reduce("mean", self.axes, True)

    def __reduce__(self):
        return (type(self), (self.axes, self.eps))

    def _row(self, x) -> int:
        """The row length when the axes are x's trailing ones (0 otherwise)."""
        k = len(self.axes)
        if self.axes != tuple(range(x.ndim - k, x.ndim)):
            return 0
        return math.prod(x.shape[x.ndim - k:])     # (np.prod: ~4 us a call)

    def _kept(self, shape) -> tuple:
        return tuple(1 if i in self.axes else n for i, n in enumerate(shape))

    def _checked(self, *descs, weights=()):
        """One float dtype for ``descs``; the axes in range for those not at
        the positions ``weights`` (a weight may have fewer dims)."""
        for k, d in enumerate(descs):
            if d.dtype.kind != "f" or d.dtype != descs[0].dtype:
                raise self.error("needs inputs of one floating-point dtype", *descs)
            if k not in weights and d.shape is not None and len(d.shape) <= self.axes[-1]:
                raise self.error(f"axes {self.axes} are out of range for shape {d.shape}", *descs)


class Standardize(_Standardize):
    """x -> (y, s): ``d = x - mean(x)``, ``s = sqrt(mean(d * d) + eps)`` and
    ``y = d / s`` over ``axes`` (s keeps them as size 1). One op, so that
    the forward runs in place in NumPy and the backward is one fused op
    (StandardizeBackward), where the elementwise decomposition recorded ~10
    ops and their backward ~20 (layer norm was 4.7x PyTorch's time)."""
    name = "Standardize"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: last axis, and two axes."""
        rng = np.random.default_rng(0)
        return [(cls((1,), 1e-3), [rng.standard_normal((3, 4))]),
                (cls((0, 2), 0.1), [rng.standard_normal((2, 3, 3))])]

    def infer(self, x):
        self._checked(x)
        return super().infer(x)

    def decompose(self, x):
        m = _apply1(Reduce("mean", self.axes, True), x)
        d = x - m
        s = _apply1(Elemwise("sqrt"), _apply1(Reduce("mean", self.axes, True), d * d) + self.eps)
        return d / s, s

    def cpu(self, x):
        if x.dtype.kind != "f" or x.size == 0:
            return super().cpu(x)
        n = self._row(x)
        if n:               # trailing axes (layer norm, group norm's view): a row at a time in C
            out = _fast.standardize_rows(x, n, self.eps)
            if out is not None:
                return out[0], out[1].reshape(self._kept(x.shape))
        # the decomposition's operations in its order, in buffers this op owns
        d = np.subtract(x, self._mean.cpu(x))
        s = self._mean.cpu(np.square(d))
        s += np.asarray(self.eps, s.dtype)
        np.sqrt(s, out=s)
        d /= s
        return d, s

    def vjp(self, inputs, outputs, grads):
        # s's gradient goes into the one backward op, which adds its term
        # where it is not zero: as separate ops (zero-filled when s is not
        # used, as in instance and group norm) they were three full-size passes
        return _one_backward(StandardizeBackward(self.axes, self.eps), grads, outputs, outputs, 1)


class StandardizeBackward(_Standardize):
    """(g, gs, y, s) -> dx = (g - mean(g) - y * mean(g * y)) / s + y * gs / M
    over ``axes`` (M values each): Standardize's backward for the gradients
    g of y and gs of s, from its outputs (d s / d x = y / M; its own backward
    is derived from this decomposition)."""
    name = "StandardizeBackward"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op`` (a positive s)."""
        rng = np.random.default_rng(0)
        return [(cls((1,), 1e-3), [rng.standard_normal((3, 4)), rng.standard_normal((3, 1)),
                                   rng.standard_normal((3, 4)), rng.uniform(0.5, 1.5, (3, 1))])]

    def infer(self, g, gs, y, s):
        descs = (g, gs, y, s)
        self._checked(*descs)
        if g.shape is not None and y.shape is not None and tuple(g.shape) != tuple(y.shape):
            raise self.error("the output gradient must have the output's shape", *descs)
        if y.shape is not None:
            kept = self._kept(y.shape)
            for t in (gs, s):
                if t.shape is not None and tuple(t.shape) != kept:
                    raise self.error(f"the scale and its gradient must have shape {kept} (y's, the axes "
                                     f"{self.axes} kept as 1)", *descs)
        return super().infer(*descs)

    def decompose(self, g, gs, y, s):
        mean = Reduce("mean", self.axes, True)
        return (g - _apply1(mean, g) - y * _apply1(mean, g * y)) / s + \
            y * _apply1(BroadcastBack(self.axes, True, True), gs, y)

    def cpu(self, g, gs, y, s):
        if g.dtype.kind != "f" or g.size == 0 or g.shape != y.shape:
            return super().cpu(g, gs, y, s)
        dx = self._through_y(g, y, s)
        # gs is s's shape and almost always zero (layer, group and instance
        # norm do not use s): checked, its term added only where it matters
        if gs.any():
            dx += y * BroadcastBack(self.axes, True, True).cpu(gs, y)
        return dx

    def _through_y(self, g, y, s):
        """dx without s's gradient's term."""
        n = self._row(g)
        if n and np.shape(s) == self._kept(g.shape):
            dx = _fast.standardize_rows_backward(g, y, s, n)
            if dx is not None:
                return dx
        t = np.multiply(g, y)
        mgy = self._mean.cpu(t)
        dx = np.subtract(g, self._mean.cpu(g))
        np.multiply(y, mgy, out=t)
        dx -= t
        dx /= s
        return dx


@functools.lru_cache(maxsize=256)
def _affine_plan(axes, x_shape, w_shape):
    """``(n, groups, inner)`` for the affine row kernels (gradcore/cpu/_kernels.pyx)
    when ``axes`` are x's trailing ones and the weight (aligned to x's dims)
    varies only along the last leading axes (``groups``: their size) and the
    first reduced axes (each row is ``n // inner`` channels of ``inner``
    values): layer norm's (..., n) with (n,), group norm's (N, G, C/G, HW)
    with (1, G, C/G, 1). None otherwise (cached: the ops ask per call)."""
    nd, k = len(x_shape), len(axes)
    if axes != tuple(range(nd - k, nd)) or len(w_shape) > nd:
        return None
    w_full = (1,) * (nd - len(w_shape)) + tuple(w_shape)
    lead = nd - k
    j = next(j for j in range(lead + 1) if w_full[j:lead] == tuple(x_shape[j:lead]))
    if any(d != 1 for d in w_full[:j]):
        return None
    q = lead
    while q < nd and w_full[q] == x_shape[q]:
        q += 1
    if any(d != 1 for d in w_full[q:]):
        return None
    return (math.prod(x_shape[lead:]), math.prod(x_shape[j:lead]), math.prod(x_shape[q:]))


class StandardizeAffine(_Standardize):
    """(x, w, b) -> (out, m, s): x standardized over ``axes`` as by
    Standardize (``m`` the mean, ``s = sqrt(var + eps)``, both keeping the
    axes as 1), then ``out = (x - m) / s * w + b`` with ``w`` and ``b`` (one
    shape) broadcast to x: layer norm's and group norm's affine form in one
    op. On the CPU one pass a row at a time (the scale and shift applied
    there); the backward (StandardizeAffineBackward) recomputes the
    standardized x from x, m and s, so only m and s are kept."""
    name = "StandardizeAffine"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: layer norm's and group norm's shapes."""
        rng = np.random.default_rng(0)
        return [(cls((1,), 1e-3), [rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(4)]),
                (cls((2, 3), 0.1), [rng.standard_normal((2, 2, 3, 2)), rng.standard_normal((1, 2, 3, 1)),
                                    rng.standard_normal((1, 2, 3, 1))])]

    def infer(self, x, w, b):
        self._checked(x, w, b, weights=(1, 2))
        if w.shape is not None and b.shape is not None and tuple(w.shape) != tuple(b.shape):
            raise self.error("the weight and the bias must have one shape", x, w, b)
        return super().infer(x, w, b)

    def decompose(self, x, w, b):
        m = _apply1(Reduce("mean", self.axes, True), x)
        d = x - m
        s = _apply1(Elemwise("sqrt"), _apply1(Reduce("mean", self.axes, True), d * d) + self.eps)
        return d / s * w + b, m, s

    def cpu(self, x, w, b):
        plan = x.size and _affine_plan(self.axes, x.shape, w.shape)
        if plan and w.shape == b.shape:
            out = _fast.norm_affine(x, w, b, *plan, self.eps)
            if out is not None:
                kept = self._kept(x.shape)
                return out[0], out[1].reshape(kept), out[2].reshape(kept)
        return super().cpu(x, w, b)

    def vjp(self, inputs, outputs, grads):
        # m and s are outputs too (the backward's own backward reaches x through
        # them): their gradients go into the one backward op, whose kernel adds
        # their terms in its pass (zero-filled when unused, they cost nothing more)
        (x, w, _), (_, m, s) = inputs, outputs
        return _one_backward(StandardizeAffineBackward(self.axes, self.eps), grads, (x, m, s), (x, w, m, s), 3)


class StandardizeAffineBackward(_Standardize):
    """(g, gm, gs, x, w, m, s) -> (dx, dw, db): StandardizeAffine's backward
    for the gradients g, gm, gs of its outputs, from its input x, weight w
    and its outputs m, s: with ``y = (x - m) / s`` and ``h = g * w``, ``dx =
    (h - mean(h) - y * mean(h * y)) / s + (gm + y * gs) / M`` over ``axes``
    (M values each), ``dw`` and ``db`` the sums of ``g * y`` and ``g`` down
    to w's shape (its own backward is derived from this decomposition)."""
    name = "StandardizeAffineBackward"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op`` (a positive s)."""
        rng = np.random.default_rng(0)
        return [(cls((1,), 1e-3), [rng.standard_normal((3, 4)), rng.standard_normal((3, 1)),
                                   rng.standard_normal((3, 1)), rng.standard_normal((3, 4)),
                                   rng.standard_normal(4), rng.standard_normal((3, 1)),
                                   rng.uniform(0.5, 1.5, (3, 1))])]

    def infer(self, g, gm, gs, x, w, m, s):
        self._checked(g, gm, gs, x, w, m, s, weights=(4,))
        descs = (g, gm, gs, x, w, m, s)
        if g.shape is not None and x.shape is not None and tuple(g.shape) != tuple(x.shape):
            raise self.error("the output gradient must have the input's shape", *descs)
        if x.shape is not None:
            kept = self._kept(x.shape)
            for t in (gm, gs, m, s):
                if t.shape is not None and tuple(t.shape) != kept:
                    raise self.error(f"the mean, the deviation and their gradients must have shape {kept} "
                                     f"(x's, the axes {self.axes} kept as 1)", *descs)
        return super().infer(g, gm, gs, x, w, m, s)

    def decompose(self, g, gm, gs, x, w, m, s):
        mean = Reduce("mean", self.axes, True)
        back = BroadcastBack(self.axes, True, True)
        y = (x - m) / s
        h = g * w
        dx = (h - _apply1(mean, h) - y * _apply1(mean, h * y)) / s + \
            (_apply1(back, gm, x) + y * _apply1(back, gs, x))
        return dx, _apply1(SumToLike(), g * y, w), _apply1(SumToLike(), g, w)

    def cpu(self, g, gm, gs, x, w, m, s):
        plan = x.size and g.shape == x.shape and _affine_plan(self.axes, x.shape, w.shape)
        if plan and m.shape == s.shape == gm.shape == gs.shape == self._kept(x.shape):
            out = _fast.norm_affine_backward(g, gm, gs, x, w, m, s, *plan)
            if out is not None:
                return out[0], out[1].reshape(w.shape), out[2].reshape(w.shape)
        return super().cpu(g, gm, gs, x, w, m, s)


# ---------------------------------------------------------------- batch normalisation
# F.batch_norm with an affine weight and bias runs as these ops: on a GPU
# through cuDNN (gradcore/cuda/cudnn.py), on the CPU through oneDNN
# (gradcore/cpu/onednn.py) in float32, elsewhere their decompositions (the
# same math in generic ops) and, on cuda without cuDNN, reductions plus the
# fused per-element kernels of ``batch_norm_source``. Every order of
# derivative works: BatchNormTraining's vjp is BatchNormBackward (its
# statistics' gradients among its inputs), whose own backward is derived
# from its decomposition; BatchNormInference's backward is derived too.
def _bn_axes(ndim):
    return tuple(i for i in range(ndim) if i != 1)


def _bn_count(x):
    """Elements per channel: the M of the mean over every axis but 1."""
    return math.prod(x.shape) // x.shape[1] if x.shape[1] else 0


class _BatchNorm(Composite):
    """``eps``; ``ndim``: the input's number of dimensions (backward graphs
    are made for every shape: the axes reduced over must be known)."""
    attrs = ("eps", "ndim")

    def __init__(self, eps=1e-5, ndim=4):
        try:
            eps = float(eps)
        except (TypeError, ValueError):
            raise TypeError(f"{self.name}: eps must be a number, got {eps!r}") from None
        if not eps >= 0:
            raise ValueError(f"{self.name}: eps must be >= 0, got {eps}")
        self.eps = eps
        self.ndim = op_int(self.name, "ndim", ndim)
        if self.ndim < 2:
            raise ValueError(f"{self.name}: ndim must be >= 2 (N, C, ...), got {ndim}")

    def _mean_back(self, g, x):
        """A per-channel g (1, C, 1, ...) spread over x's shape, divided by
        the elements per channel: the backward of the mean over every axis but 1."""
        return _apply1(BroadcastBack(_bn_axes(self.ndim), True, True), g, x)

    def _check(self, x, params, what):
        """x is (N, C, ...) and each of ``params`` (named by ``what``) is
        (1, C, 1, ...), all of one floating-point dtype."""
        if x.shape is None:
            return
        if len(x.shape) != self.ndim:
            raise self.error(f"input must be {self.ndim}-D (N, C, ...), got shape {x.shape}", x, *params)
        want = (1, x.shape[1]) + (1,) * (len(x.shape) - 2)
        for name, p in zip(what, params):
            if p.shape is not None and tuple(p.shape) != want:
                raise self.error(f"{name} must have shape {want} (one per channel), got {p.shape}", x, *params)
        for d in (x,) + tuple(params):
            if d.dtype.kind != "f" or d.dtype != x.dtype:
                raise self.error(f"needs inputs of one floating-point dtype, got "
                                 f"{', '.join(str(p.dtype) for p in (x,) + tuple(params))}", x, *params)

    def cuda_source(self, ctype: str = "float") -> str:
        return batch_norm_source(ctype)


class BatchNormTraining(_BatchNorm):
    """(x, weight, bias) -> (y, mean, invstd): batch normalisation with the
    batch's statistics over every axis but 1; weight, bias and both
    statistics are (1, C, 1, ...); invstd = 1 / sqrt(biased variance + eps)."""
    name = "BatchNormTraining"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: 4-D and 2-D."""
        rng = np.random.default_rng(0)
        return [(cls(1e-3), [rng.standard_normal(s) for s in ((3, 2, 2, 2), (1, 2, 1, 1), (1, 2, 1, 1))]),
                (cls(0.1, 2), [rng.standard_normal(s) for s in ((4, 3), (1, 3), (1, 3))])]

    def infer(self, x, w, b):
        self._check(x, (w, b), ("weight", "bias"))
        return super().infer(x, w, b)

    def decompose(self, x, w, b):
        axes = _bn_axes(self.ndim)
        m = _apply1(Reduce("mean", axes, True), x)
        d = x - m
        v = _apply1(Reduce("mean", axes, True), d * d)
        invstd = _apply1(Elemwise("div"), 1.0, _apply1(Elemwise("sqrt"), v + self.eps))
        return d * invstd * w + b, m, invstd

    def vjp(self, inputs, outputs, grads):
        # the mean's and invstd's gradients go into the one backward op (it
        # adds their terms where they are not zero): as separate ops they
        # were full-size passes over zero-filled gradients on every step
        (x, w, _), (_, m, invstd) = inputs, outputs
        return _one_backward(BatchNormBackward(self.eps, self.ndim), grads, (x, m, invstd), (x, w, m, invstd), 3)

    def cpu(self, x, w, b):
        done = onednn.batch_norm_training(x, w, b, self.eps)
        return done if done is not None else super().cpu(x, w, b)

    def cuda(self, be, x, w, b):
        done = cudnn.batch_norm_training(be, x, w, b, self.eps)
        if done is not None:
            return done
        axes = _bn_axes(self.ndim)
        m = be.reduce("mean", x, axes, True)
        d = be.elementwise("sub", x, m)
        v = be.reduce("mean", be.elementwise("mul", d, d), axes, True)
        invstd = be.elementwise("div", 1.0, be.elementwise("sqrt", be.elementwise("add", v, self.eps)))
        return _bn_apply(self, be, x, m, invstd, w, b), m, invstd


class BatchNormBackward(_BatchNorm):
    """(g, gm, gi, x, weight, mean, invstd) -> (dx, dweight, dbias): the
    backward of BatchNormTraining for the gradients g, gm, gi of its outputs
    y, mean and invstd (mean and invstd as saved by it): with ``M`` values
    per channel, dx is the backward through y plus ``gm / M - gi * invstd^3
    * (x - mean) / M``."""
    name = "BatchNormBackward"

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op`` (a positive inverse std)."""
        rng = np.random.default_rng(0)
        g, gm, gi, x, w, m = (rng.standard_normal(s) for s in ((3, 2, 2), (1, 2, 1), (1, 2, 1), (3, 2, 2),
                                                               (1, 2, 1), (1, 2, 1)))
        return [(cls(1e-3, 3), [g, gm, gi, x, w, m, rng.uniform(0.5, 1.5, (1, 2, 1))])]

    def infer(self, g, gm, gi, x, w, m, invstd):
        descs = (g, gm, gi, x, w, m, invstd)
        self._check(x, (gm, gi, w, m, invstd), ("the mean's gradient", "invstd's gradient", "weight", "mean",
                                                "invstd"))
        if g.shape is not None and x.shape is not None and tuple(g.shape) != tuple(x.shape):
            raise self.error("the output gradient must have the input's shape", *descs)
        return super().infer(*descs)

    def _stats_terms(self, gm, gi, x, m, invstd, mean_back):
        """dx's terms from the statistics' gradients: d mean / dx = 1 / M,
        d invstd / dx = -invstd^3 (x - mean) / M (tensors or, with the
        CPU kernel's ``mean_back``, arrays)."""
        return mean_back(gm, x) + (x - m) * mean_back(gi * invstd * invstd * invstd * -1.0, x)

    def decompose(self, g, gm, gi, x, w, m, invstd):
        axes = _bn_axes(self.ndim)
        xhat = (x - m) * invstd
        db = _apply1(Reduce("sum", axes, True), g)
        dw = _apply1(Reduce("sum", axes, True), g * xhat)
        dx = (w * invstd) * (g - self._mean_back(db, x) - xhat * self._mean_back(dw, x))
        return dx + self._stats_terms(gm, gi, x, m, invstd, self._mean_back), dw, db

    def cpu(self, g, gm, gi, x, w, m, invstd):
        done = onednn.batch_norm_backward(g, x, w, m, invstd, self.eps)
        if done is None:
            return super().cpu(g, gm, gi, x, w, m, invstd)
        # the statistics' gradients are per channel and almost always zero
        # (the running statistics take them detached): checked, not added
        if gm.any() or gi.any():
            back = BroadcastBack(_bn_axes(self.ndim), True, True)
            return (done[0] + self._stats_terms(gm, gi, x, m, invstd, back.cpu),) + tuple(done[1:])
        return done

    def cuda(self, be, g, gm, gi, x, w, m, invstd):
        done = cudnn.batch_norm_backward(be, g, x, w, m, invstd, self.eps)
        if done is not None:
            return self._cuda_stats_terms(be, done, gm, gi, x, m, invstd)
        axes = _bn_axes(self.ndim)
        xhat = be.elementwise("mul", be.elementwise("sub", x, m), invstd)
        db = be.reduce("sum", g, axes, True)
        dw = be.reduce("sum", be.elementwise("mul", g, xhat), axes, True)
        c, s = _bn_channels(x)
        dx = be.empty(x.shape, x.dtype)
        T = be.ctype(x.dtype)
        kernel = be.kernel(self, T, name=kernel_name("batch_norm_grad_input", T), source=batch_norm_source(T))
        be.launch_n(kernel, dx.size, g, x, w, m, invstd, dw, db, dx, dx.size, c, s, max(_bn_count(x), 1))
        return self._cuda_stats_terms(be, (dx, dw, db), gm, gi, x, m, invstd)

    def _cuda_stats_terms(self, be, done, gm, gi, x, m, invstd):
        """``done`` (dx, dw, db) with the statistics' terms added to dx."""
        dx, dw, db = done
        n = max(_bn_count(x), 1)
        ew = be.elementwise
        coef = ew("div", ew("mul", ew("mul", ew("mul", gi, invstd), invstd), invstd), -float(n))
        dx = ew("add", dx, ew("add", ew("div", gm, float(n)), ew("mul", ew("sub", x, m), coef)))
        return dx, dw, db


class BatchNormInference(_BatchNorm):
    """(x, mean, var, weight, bias) -> (x - mean) / sqrt(var + eps) * weight
    + bias, with given statistics (the running ones), each (1, C, 1, ...)."""
    name = "BatchNormInference"

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op`` (a positive variance)."""
        rng = np.random.default_rng(0)
        x, m, w, b = (rng.standard_normal(s) for s in ((2, 2, 3), (1, 2, 1), (1, 2, 1), (1, 2, 1)))
        return [(cls(1e-3, 3), [x, m, rng.uniform(0.5, 1.5, (1, 2, 1)), w, b])]

    def infer(self, x, m, v, w, b):
        self._check(x, (m, v, w, b), ("mean", "var", "weight", "bias"))
        return super().infer(x, m, v, w, b)

    def decompose(self, x, m, v, w, b):
        return (x - m) / _apply1(Elemwise("sqrt"), v + self.eps) * w + b

    def cpu(self, x, m, v, w, b):
        done = onednn.batch_norm_inference(x, m, v, w, b, self.eps)
        return done if done is not None else super().cpu(x, m, v, w, b)

    def cuda(self, be, x, m, v, w, b):
        done = cudnn.batch_norm_inference(be, x, m, v, w, b, self.eps)
        if done is not None:
            return done
        invstd = be.elementwise("div", 1.0, be.elementwise("sqrt", be.elementwise("add", v, self.eps)))
        return _bn_apply(self, be, x, m, invstd, w, b)


def _bn_channels(x):
    """(C, S): channels, and elements per channel per image."""
    c = x.shape[1]
    return c, (math.prod(x.shape[2:]) if x.ndim > 2 else 1)


def _bn_apply(op, be, x, m, invstd, w, b):
    """y = (x - mean) * invstd * weight + bias, one thread per element."""
    c, s = _bn_channels(x)
    y = be.empty(x.shape, x.dtype)
    T = be.ctype(x.dtype)
    kernel = be.kernel(op, T, name=kernel_name("batch_norm_apply", T), source=batch_norm_source(T))
    be.launch_n(kernel, y.size, x, m, invstd, w, b, y, y.size, c, s)
    return y


@functools.lru_cache(maxsize=None)      # built once per type: launchers ask on every call
def batch_norm_source(ctype: str = "float") -> str:
    """The batch-norm ops' per-element kernels (one thread per element,
    grid-stride; x viewed as (N, C, S), per-channel arrays of C):

    ``gc_batch_norm_apply_<ctype>(x, mean, invstd, w, b, y, n, C, S)``:
    y = (x - mean[c]) * invstd[c] * w[c] + b[c];

    ``gc_batch_norm_grad_input_<ctype>(g, x, w, mean, invstd, dw, db, dx, n, C, S, M)``:
    dx = w[c] * invstd[c] * (g - (db[c] + xhat * dw[c]) / M), xhat = (x - mean[c]) * invstd[c].
    """
    return source(ctype, _BN_APPLY, _BN_GRAD_INPUT)


_BN_APPLY = Kernel("batch_norm_apply", "const T* __restrict__ x, const T* __restrict__ mean, "
                   "const T* __restrict__ invstd, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y, "
                   "long long total, long long C, long long S", """
    const long long c = idx / S % C;
    y[idx] = (x[idx] - mean[c]) * invstd[c] * w[c] + b[c];""", over="total")
_BN_GRAD_INPUT = Kernel("batch_norm_grad_input", "const T* __restrict__ g, const T* __restrict__ x, "
                        "const T* __restrict__ w, const T* __restrict__ mean, const T* __restrict__ invstd, "
                        "const T* __restrict__ dw, const T* __restrict__ db, T* __restrict__ dx, long long total, "
                        "long long C, long long S, long long M", """
    const long long c = idx / S % C;
    const T xhat = (x[idx] - mean[c]) * invstd[c];
    dx[idx] = w[c] * invstd[c] * (g[idx] - (db[c] + xhat * dw[c]) / (T)M);""", over="total")
