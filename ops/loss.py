"""Loss ops: the fused cross-entropy of ``F.cross_entropy`` and the
connectionist temporal classification loss (``F.nn.ctc_loss``).

- ``CrossEntropy(axis, label_smooth)``: (pred float, label int) -> the
  per-sample negative log likelihood of the softmax of ``pred`` along
  ``axis`` at ``label`` (pred's shape without ``axis``), MegEngine's label
  smoothing included: ``lse(z) - (1 - a) * z[label] - a * mean(z)`` with
  ``z = pred - max(pred)``, ``a = label_smooth``. One kernel (a thread or a
  block per row) where log_softmax, indexing_one_hot and a negation took
  three;
- ``CrossEntropyGrad(axis, label_smooth)``: (pred, label, g) -> ``(softmax(pred)
  - (1 - a) * onehot(label) - a / n) * g`` broadcast along ``axis``: one
  kernel. A Composite: its decomposition is the same math in existing ops
  (Softmax, IndexingOneHotGrad, BroadcastBack), so its own backward, and
  every higher order, is derived;
- ``CTCLoss(blank)``: (log_probs (T, N, C), targets (N, S) int, input_lengths
  (N,) int, target_lengths (N,) int) -> nll (N,), the negative log
  likelihood of each target sequence (the alpha recursion in log space;
  inf where no alignment exists);
- ``CTCLossGrad(blank)``: (..., nll, g) -> the gradient of sum(g * nll)
  with respect to log_probs, from the alpha and beta recursions:
  ``-g[n] * sum over s with l'(s) = c of exp(alpha + beta - lp + nll)`` for
  t < input_length, 0 elsewhere and for a sample whose nll is infinite.

CTCLoss's gradient is the true gradient with respect to ``log_probs``; PyTorch's
``ctc_loss`` returns ``exp(log_probs)`` plus this, the gradient with respect to
the logits of a log_softmax, which agrees once chained through a
log_softmax (the usual case, tested). As in PyTorch there is no second
order: ``CTCLossGrad`` declares no gradient.

Example::

    >>> import numpy as np, gradcore as gc
    >>> from gradcore.core import apply
    >>> lp = gc.tensor(np.log(np.full((2, 1, 2), 0.5)))
    >>> (nll,) = apply(CTCLoss(0), lp, gc.tensor([[1]]), gc.tensor([2]), gc.tensor([1]))
    >>> round(float(np.exp(-nll.item())), 4)      # paths "1-", "-1", "11" of 4
    0.75
"""
from __future__ import annotations

import functools
import math

import numpy as np

from gradcore._core import apply
from gradcore.op import Composite, IndexOpError, Op, TensorDesc
from gradcore.cuda.kernels import Kernel

from .indexing import IndexingOneHot, IndexingOneHotGrad, _host, _index32
from .linalg import check_cuda_dtype
from .nn import LogSoftmax, Softmax
from .reduce import BLOCK_REDUCE, MAX_BLOCKS, SHORT_AXIS, BroadcastBack, Reduce, op_int, row_threads

__all__ = ["CrossEntropy", "CrossEntropyGrad", "CTCLoss", "CTCLossGrad"]


# ---------------------------------------------------------------- cross-entropy
# F.cross_entropy on logits runs as CrossEntropy (then its reduction);
# CrossEntropy's vjp is CrossEntropyGrad, whose own backward is derived from
# its decomposition, so gradients of every order are right. Both view pred as
# (outer, n, inner) around the class axis, and label, the loss and its
# gradient g as (outer, inner): one row of n classes per sample.
def _smoothing(op_name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
        raise TypeError(f"{op_name}: label_smooth must be a number, got {v!r}")
    return float(v)


def _ce_check(op, pred, label, g=None):
    """The shape inference of both ops: pred's shape without the class axis
    (None while traced), after their checks."""
    descs = (pred, label) if g is None else (pred, label, g)
    if pred.dtype.kind != "f":
        raise op.error(f"pred must be floating-point (class scores), got {pred.dtype}", *descs)
    if label.dtype.kind not in "iu":
        raise op.error(f"label must be an integer tensor (class indices), got {label.dtype}", *descs)
    if g is not None and g.dtype.kind != "f":
        raise op.error(f"the gradient must be floating-point, got {g.dtype}", *descs)
    if pred.shape is None:
        return None
    if pred.ndim == 0:
        raise op.error("pred needs a class axis, got a 0-d tensor", *descs)
    if not -pred.ndim <= op.axis < pred.ndim:
        raise op.error(f"axis {op.axis} is out of range for {pred.ndim} dimensions", *descs)
    ax = op.axis % pred.ndim
    want = pred.shape[:ax] + pred.shape[ax + 1:]
    for what, d in (("label", label), ("the gradient", g)):
        if d is not None and d.shape is not None and tuple(d.shape) != want:
            raise op.error(f"{what} must have shape {want} (pred's without the class axis {ax}), "
                           f"got {tuple(d.shape)}", *descs)
    return want


def _ce_check_labels(op, lo, hi, pred_shape, ax, label_shape):
    """A label out of [0, n) is an IndexError naming the op (indexing would
    count a negative one from the end, NumPy's rule, and score the wrong class
    silently). ``lo``, ``hi``: the labels' least and greatest (None: no labels)."""
    n = pred_shape[ax]
    if lo is not None and (lo < 0 or hi >= n):
        bad = lo if lo < 0 else hi
        raise IndexOpError(f"{op._name()}: label {bad} out of range for {n} classes along axis {ax} "
                           f"(labels are class indices in [0, {n})) (input shapes: {tuple(pred_shape)}, "
                           f"{tuple(label_shape)})")


def _ce_prepare(op, pred, label, g=None):
    """For the NumPy kernels, pred viewed as (outer, n, inner) around the
    class axis: (z = that view minus its max along n, or None when pred is
    empty; the index of each sample's label class in z, a tuple for fancy
    indexing; n, inner)."""
    shape = pred.shape
    ax = op.axis % len(shape)
    want = shape[:ax] + shape[ax + 1:]
    if label.shape != want or (g is not None and np.shape(g) != want):    # indexing would broadcast
        raise op.error(f"label (and the gradient) must have shape {want}", *(
            TensorDesc(a.shape, a.dtype) for a in ((pred, label) if g is None else (pred, label, g))))
    if label.size:
        _ce_check_labels(op, label.min(), label.max(), shape, ax, label.shape)
    outer, n, inner = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])
    if pred.size == 0:
        return None, None, n, inner
    x = pred.reshape(outer, n, inner)
    # plain fancy indexing, not take/put_along_axis (several times slower on small batches)
    picked = (np.arange(outer)[:, None], label.reshape(outer, inner), np.arange(inner)[None, :])
    return x - x.max(axis=1, keepdims=True), picked, n, inner


class _CrossEntropyParams:
    """The parameters CrossEntropy and its gradient share: the class axis and
    the label smoothing (also as the kernels' double argument)."""
    attrs = ("axis", "label_smooth")
    derived = ("_smooth",)
    devices = ("cpu", "cuda")

    def __init__(self, axis: int = 1, label_smooth: float = 0.0):
        self.axis = op_int(self.name, "axis", axis)
        self.label_smooth = _smoothing(self.name, label_smooth)
        self._smooth = np.float64(self.label_smooth)      # the kernels' argument


class CrossEntropy(_CrossEntropyParams, Op):
    """(pred, label) -> the per-sample cross-entropy of the logits ``pred``
    along ``axis`` against the class indices ``label`` (pred's shape without
    ``axis``; a label in [0, n), else an IndexError), with MegEngine's label
    smoothing: what ``F.cross_entropy(pred, label, axis,
    label_smooth=label_smooth, reduction="none")`` returns.

    Example::

        >>> import gradcore as gc
        >>> (nll,) = apply(CrossEntropy(1), gc.tensor([[0.0, 0.0], [0.0, 1.0]]), gc.tensor([0, 1]))
        >>> [round(v, 4) for v in nll.numpy().tolist()]          # log 2, log(1 + 1/e)
        [0.6931, 0.3133]
    """
    name = "CrossEntropy"
    reduce_broadcast = False

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: (N, C); (N, C, d)
        with label smoothing; the class axis last and long (a block per row
        on cuda)."""
        rng = np.random.default_rng(0)
        return [(cls(1), [rng.standard_normal((3, 4)), np.array([0, 3, 1])]),
                (cls(1, 0.1), [rng.standard_normal((2, 3, 2)), np.array([[2, 0], [1, 1]])]),
                (cls(-1), [rng.standard_normal((2, 40)), np.array([39, 5])])]

    def infer(self, pred, label):
        return (TensorDesc(_ce_check(self, pred, label), pred.dtype, pred.device),)

    def cpu(self, pred, label):
        z, picked, n, inner = _ce_prepare(self, pred, label)
        if z is None:
            return np.zeros(label.shape, pred.dtype)
        a = self.label_smooth
        nll = -z[picked] if not a else z[picked] * (a - 1)
        if a:       # only then: a class scored -inf (masked) would give 0 * -inf
            nll -= z.mean(axis=1) * a
        nll += np.log(np.exp(z, out=z).sum(axis=1))          # z is ours: exp in place
        return nll.reshape(label.shape).astype(pred.dtype, copy=False)

    def vjp(self, inputs, outputs, grads):
        (pred, label), (g,) = inputs, grads
        return [apply(CrossEntropyGrad(self.axis, self.label_smooth), pred, label, g)[0], None]

    def decompose(self, pred, label):
        """The same math in the ops F.cross_entropy composed before this op
        (a reference for the tests; the vjp above is what backward uses)."""
        logp = apply(LogSoftmax(self.axis), pred)[0]
        picked = apply(IndexingOneHot(self.axis), logp, label)[0]
        if not self.label_smooth:
            return -picked
        a = self.label_smooth
        return picked * (a - 1.0) - apply(Reduce("mean", self.axis), logp)[0] * a

    def cuda(self, be, pred, label):
        return _ce_launch(self, be, pred, label)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_cross_entropy_<ctype>_<i32|i64>(x, label, y, outer, n, inner,
        smooth)``: x contiguous, viewed as (outer, n, inner) around the axis;
        label (int32 or int64) and y as (outer, inner); a thread per row
        (adjacent threads on adjacent columns): a max pass, a pass summing
        exp(z) (and z, when smoothing), a write. And
        ``gc_cross_entropy_rows_<ctype>_<i32|i64>(x, label, y, rows, n,
        smooth)`` for inner 1: a block per row, block reductions. A label
        out of range (the host checks first) gives NaN, reading nothing."""
        return _ce_source("cross_entropy", ctype)


class CrossEntropyGrad(_CrossEntropyParams, Composite):
    """(pred, label, g) -> the gradient of ``sum(g * CrossEntropy(axis,
    label_smooth)(pred, label))`` with respect to pred: ``(softmax(pred) -
    (1 - a) * onehot(label) - a / n) * g`` with g broadcast along ``axis``.
    One kernel; its backward is derived from ``decompose`` (so every order
    of gradient of the cross-entropy is right). The label gets no gradient.

    Example::

        >>> import gradcore as gc
        >>> (d,) = apply(CrossEntropyGrad(1), gc.tensor([[0.0, 0.0]]), gc.tensor([1]), gc.tensor([2.0]))
        >>> d.numpy().tolist()                     # (softmax - onehot) * g
        [[1.0, -1.0]]
    """
    name = "CrossEntropyGrad"

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: CrossEntropy's, with a g."""
        rng = np.random.default_rng(1)
        out = []
        for op, (pred, label) in CrossEntropy.examples():
            out.append((cls(op.axis, op.label_smooth), [pred, label, rng.standard_normal(label.shape)]))
        return out

    def infer(self, pred, label, g):
        _ce_check(self, pred, label, g)
        return (TensorDesc(pred.shape, pred.dtype, pred.device),)

    def cpu(self, pred, label, g):
        z, picked, n, inner = _ce_prepare(self, pred, label, g)
        if z is None:
            return np.zeros(pred.shape, pred.dtype)
        a = self.label_smooth
        g = np.reshape(g, (-1, 1, inner))
        d = np.exp(z, out=z)                            # z is ours: in place
        d *= g / d.sum(axis=1, keepdims=True)           # softmax * g in one pass
        d[picked] -= g[:, 0, :] if not a else g[:, 0, :] * (1 - a)   # one label per row: no repeats
        if a:
            d -= g * (a / n)
        return d.reshape(pred.shape).astype(pred.dtype, copy=False)

    def decompose(self, pred, label, g):
        # softmax * g - (1 - a) * onehot * g - a * g / n, g spread along the axis
        spread = apply(BroadcastBack((self.axis,), False), g, pred)[0]
        d = apply(Softmax(self.axis), pred)[0] * spread
        onehot = apply(IndexingOneHotGrad(self.axis, False), g, pred, label)[0]
        a = self.label_smooth
        if not a:
            return d - onehot
        return d - onehot * (1.0 - a) - apply(BroadcastBack((self.axis,), False, True), g, pred)[0] * a

    def cuda(self, be, pred, label, g):
        return _ce_launch(self, be, pred, label, g)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_cross_entropy_grad_<ctype>_<i32|i64>(x, label, g, dx, outer,
        n, inner, smooth)``: as CrossEntropy's, a thread per row writing its
        row of dx; and ``gc_cross_entropy_grad_rows_...(x, label, g, dx,
        rows, n, smooth)``, a block per row."""
        return _ce_source("cross_entropy_grad", ctype)


# the label types the kernels read as they are (others are cast to int32 first)
_CE_LABELS = {np.dtype("int32"): "int", np.dtype("int64"): "long long"}


def _ce_launch(op, be, pred, label, g=None):
    """Run ``op``'s kernel (a block per row when the class axis is last and
    longer than SHORT_AXIS, else a thread per row) into a new array."""
    key = (pred.shape, pred.dtype, label.dtype) if g is None else (pred.shape, pred.dtype, label.dtype, g.shape)
    plans = op.__dict__.get("_plans")      # ops are immutable: a cache beside the attributes
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = _ce_plan(op, be, pred, label, g)
        if plans is None:
            plans = op.__dict__["_plans"] = {}
        if len(plans) >= 256:
            plans.clear()
        plans[key] = plan
    out_shape, ax, outer, n, inner, ctype, source, grid, block = plan
    if g is None:
        # as on the cpu, a label out of range raises: checked on the labels'
        # [min, max], read back once per content (a step reusing its labels
        # copies nothing). CrossEntropyGrad's labels are the forward's,
        # checked there; in the kernels a label out of range only gives NaN
        extent = be.index_extent(label).tolist()
        if extent:
            _ce_check_labels(op, extent[0], extent[1], pred.shape, ax, label.shape)
    if label.dtype not in _CE_LABELS:      # other integers as int32 (in range: no value wraps)
        label = _index32(be, label)
    y = be.empty(out_shape, pred.dtype)
    if outer * inner == 0:
        return y
    kernel = be.kernel(op, ctype, source=source)
    if g is None:
        args = (pred, label, y)
    else:
        args = (pred, label, g if g.dtype == pred.dtype else be.cast(g, pred.dtype), y)
    if block:
        be.launch(kernel, grid, block, *args, outer, n, op._smooth)
    else:
        be.launch_n(kernel, outer * inner, *args, outer, n, inner, op._smooth)
    return y


def _ce_plan(op, be, pred, label, g):
    """What ``_ce_launch`` needs for inputs of these shapes and dtypes,
    worked out (and the inputs checked) once: (output shape, axis, outer, n,
    inner, element C type, kernel source, grid and block of a block per row
    or None)."""
    (out,) = op.infer_arrays(pred, label) if g is None else op.infer_arrays(pred, label, g)
    check_cuda_dtype(op, pred.dtype)
    ax = op.axis % pred.ndim
    outer, n, inner = int(math.prod(pred.shape[:ax])), pred.shape[ax], int(math.prod(pred.shape[ax + 1:]))
    ctype = be.ctype(pred.dtype)
    kind = "cross_entropy" if g is None else "cross_entropy_grad"
    lab = _CE_LABELS.get(label.dtype, "int")
    if inner == 1 and n > SHORT_AXIS:      # a block per row
        source = _ce_source(kind, ctype, lab, "block")
        return out.shape, ax, outer, n, inner, ctype, source, (min(outer, MAX_BLOCKS),), (row_threads(n),)
    return out.shape, ax, outer, n, inner, ctype, _ce_source(kind, ctype, lab, "thread"), None, None


# per kernel: (its output parameters, a thread per row: the write for a label
# out of range and the write, a block per row: the same)
_CE_KINDS = {
    "cross_entropy": (
        "T* __restrict__ y",
        "y[idx] = (T)nan(\"\");",
        """
        T nll = log(s) - (1 - a) * (p[k * inner] - m);
        if (smooth != 0) nll -= a * zs / (T)n;      // only then: a masked class (-inf) would give 0 * -inf
        y[idx] = nll;""",
        "if (threadIdx.x == 0) y[idx] = (T)nan(\"\");",
        """
        if (threadIdx.x == 0) {
            T nll = log(s) - (1 - a) * (p[k] - m);
            if (smooth != 0) nll -= a * zs / (T)n;
            y[idx] = nll;
        }"""),
    "cross_entropy_grad": (
        "const T* __restrict__ g, T* __restrict__ dx",
        "for (long long j = 0; j < n; ++j) dx[base + j * inner] = (T)nan(\"\");",
        """
        const T ls = log(s), gi = g[idx], off = a / (T)n;
        for (long long j = 0; j < n; ++j)
            dx[base + j * inner] = (exp((p[j * inner] - m) - ls) - (j == k ? 1 - a : (T)0) - off) * gi;""",
        "for (long long j = threadIdx.x; j < n; j += blockDim.x) dx[base + j] = (T)nan(\"\");",
        """
        const T ls = log(s), gi = g[idx], off = a / (T)n;
        for (long long j = threadIdx.x; j < n; j += blockDim.x)
            dx[base + j] = (exp((p[j] - m) - ls) - (j == k ? 1 - a : (T)0) - off) * gi;"""),
}
_CE_SUFFIX = {"int": "_i32", "long long": "_i64"}


@functools.lru_cache(maxsize=None)      # built once per kind and types: launchers ask on every call
def _ce_source(kind: str, ctype: str, label: str = "", per: str = "") -> str:
    """The cross-entropy kernel ``kind`` for element type ``ctype``, labels
    of C type ``label`` ("int" or "long long"), a thread (``per`` "thread")
    or a block ("block") per row, as the source of a module of its own (the
    host emulator runs a thread-per-row kernel in one pass, without fibers);
    without ``label`` and ``per``, all four. Each: m = the row's max, s =
    sum(exp(x - m)) (and zs = sum(x - m) when smoothing), then the write;
    a label out of [0, n) writes NaN and reads nothing."""
    if not label or not per:
        return "".join(_ce_source(kind, ctype, lab, p) for lab in _CE_SUFFIX for p in ("thread", "block"))
    outs, thread_bad, thread_write, block_bad, block_write = _CE_KINDS[kind]
    ins = f"const T* __restrict__ x, const {label}* __restrict__ label, {outs}"
    if per == "thread":
        return Kernel(kind, f"{ins}, long long outer, long long n, long long inner, double smooth", f"""
            const long long base = (idx / inner) * n * inner + idx % inner;
            const T* p = x + base;
            const long long k = label[idx];
            if (k < 0 || k >= n) {{ {thread_bad} continue; }}
            const T a = (T)smooth;
            T m = p[0], s = 0, zs = 0;
            for (long long j = 1; j < n; ++j) m = p[j * inner] > m ? p[j * inner] : m;
            for (long long j = 0; j < n; ++j) {{ const T z = p[j * inner] - m; s += exp(z); zs += z; }}
            {thread_write}""", over="total", suffix=_CE_SUFFIX[label],
                      setup="const long long total = outer * inner;").source(ctype)
    return Kernel(f"{kind}_rows", f"{ins}, long long rows, long long n, double smooth", f"""
        const long long base = idx * n;
        const T* p = x + base;
        const long long k = label[idx];
        if (k < 0 || k >= n) {{ {block_bad} continue; }}      // uniform per block
        const T a = (T)smooth;
        T m = p[0], s = 0, zs = 0;
        for (long long j = threadIdx.x; j < n; j += blockDim.x) m = p[j] > m ? p[j] : m;
        m = gc_block_reduce(m, scratch, gc_op_max());
        for (long long j = threadIdx.x; j < n; j += blockDim.x) {{ const T z = p[j] - m; s += exp(z); zs += z; }}
        s = gc_block_reduce(s, scratch, gc_op_sum());
        if (smooth != 0) zs = gc_block_reduce(zs, scratch, gc_op_sum());   // uniform: an argument
        {block_write}""", over="rows", per="block", suffix=_CE_SUFFIX[label],
                  setup="__shared__ T scratch[32];").source(ctype, helpers=BLOCK_REDUCE)


# ---------------------------------------------------------------- CTC

def _check(op, lp, targets, il, tl, *more):
    if lp.dtype.kind != "f":
        raise op.error(f"log_probs must be floating-point, got {lp.dtype}", lp, targets, il, tl, *more)
    for what, d in (("targets", targets), ("input_lengths", il), ("target_lengths", tl)):
        if d.dtype.kind not in "iu":
            raise op.error(f"{what} must be an integer tensor, got {d.dtype}", lp, targets, il, tl, *more)
    if lp.shape is None or targets.shape is None or il.shape is None or tl.shape is None:
        return
    if lp.ndim != 3:
        raise op.error(f"log_probs must be (T, N, C), got shape {lp.shape}", lp, targets, il, tl, *more)
    N = lp.shape[1]
    if targets.ndim != 2 or targets.shape[0] != N or tuple(il.shape) != (N,) or tuple(tl.shape) != (N,):
        raise op.error(f"for log_probs {lp.shape}, targets must be ({N}, S) and the lengths ({N},)",
                       lp, targets, il, tl, *more)
    if lp.shape[2] < 1:
        raise op.error("log_probs needs at least one class (the blank)", lp, targets, il, tl)
    if not 0 <= op.blank < lp.shape[2]:
        raise op.error(f"blank {op.blank} is not one of the {lp.shape[2]} classes of log_probs",
                       lp, targets, il, tl, *more)


def _check_ctc_values(op, lp, targets, il, tl):
    """Lengths within (T, S) and the labels they cover within the classes:
    the recursion would clip them and return the loss of another problem.
    (Host arrays; on cuda the launcher passes a host copy of the small ones.)"""
    T, N, C = lp.shape
    S = targets.shape[1]
    il, tl, targets = np.asarray(il), np.asarray(tl), np.asarray(targets)
    descs = [TensorDesc(a.shape, a.dtype, "") for a in (lp, targets, il, tl)]
    for what, v, top in (("input_lengths", il, T), ("target_lengths", tl, S)):
        if v.size and (v.min() < 0 or v.max() > top):
            bad = v.min() if v.min() < 0 else v.max()
            raise op.error(f"{what} must be in [0, {top}], got {bad}", *descs)
    used = np.arange(S)[None, :] < tl[:, None]
    if used.any():
        vals = targets[used]
        if vals.min() < 0 or vals.max() >= C:
            bad = vals.min() if vals.min() < 0 else vals.max()
            raise IndexOpError(f"{op._name()}: label {bad} is not one of the {C} classes of log_probs "
                               f"(input shapes: {', '.join(str(d.shape) for d in descs)})")


def _lse(*xs):
    m = np.maximum.reduce(xs)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = sum(np.exp(x - safe) for x in xs)
        return np.where(np.isneginf(m), -np.inf, np.log(s) + safe)


def _ctc_setup(lp, targets, il, tl, blank):
    T, N, C = lp.shape
    S = targets.shape[1]
    L = 2 * S + 1
    il = np.clip(np.asarray(il, np.int64), 0, T)
    tl = np.clip(np.asarray(tl, np.int64), 0, S)
    ext = np.full((N, L), blank, np.int64)
    ext[:, 1::2] = np.clip(targets, 0, C - 1)
    valid = np.arange(L)[None, :] < (2 * tl + 1)[:, None]
    lpe = lp[:, np.arange(N)[:, None], ext]                 # (T, N, L)
    lpe = np.where(valid[None], lpe, -np.inf)
    skip = np.zeros((N, L), bool)
    # (MegEngine's rule: a label the same as the blank symbol may be skipped to too)
    skip[:, 2:] = ext[:, 2:] != ext[:, :-2]
    return T, N, C, L, il, tl, ext, lpe, skip


def _ctc_alpha(lpe, skip, T, N, L, floor=-np.inf):
    alpha = np.full((T, N, L), -np.inf, lpe.dtype)
    if T == 0:
        return alpha
    alpha[0, :, :2] = lpe[0, :, :2]
    alpha[0, :, 2:] = floor             # the states no alignment starts in (MegEngine: log of the tiniest float)
    neg = np.full((N, 1), -np.inf, lpe.dtype)
    for t in range(1, T):
        a = alpha[t - 1]
        a1 = np.concatenate([neg, a[:, :-1]], 1)
        a2 = np.where(skip, np.concatenate([neg, neg, a[:, :-2]], 1)[:, :L], -np.inf)
        alpha[t] = _lse(a, a1, a2) + lpe[t]
    return alpha


def _ctc_nll(alpha, il, tl, N):
    n = np.arange(N)
    last = alpha[np.maximum(il - 1, 0), n]                   # (N, L)
    end = last[n, 2 * tl]
    end2 = np.where(tl > 0, last[n, np.maximum(2 * tl - 1, 0)], -np.inf)
    ll = _lse(end, end2)
    ll = np.where(il > 0, ll, np.where(tl == 0, 0.0, -np.inf))
    return -ll


class CTCLoss(Op):
    """(log_probs (T, N, C), targets (N, S), input_lengths (N,),
    target_lengths (N,)) -> the per-sample negative log likelihood (N,)."""
    name = "CTCLoss"
    reduce_broadcast = False
    devices = ("cpu", "cuda")
    attrs = ("blank", "floor")
    max_grad_order = 1      # CTCLossGrad declares no gradient: check_op's gradgrad is not applicable

    def __init__(self, blank: int = 0, floor: float = -math.inf):
        # floor: the log-probability the alignments that cannot start at t = 0
        # start with: -inf (PyTorch's: an impossible target's loss is inf),
        # or MegEngine's log of the dtype's tiniest number (a large finite loss)
        self.blank, self.floor = int(blank), float(floor)

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op``: T 5, N 2, C 3, repeated labels and a shorter sample."""
        rng = np.random.default_rng(0)
        x = rng.standard_normal((5, 2, 3))
        lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return [(cls(0), [lp, np.array([[1, 1], [2, 0]]), np.array([5, 4]), np.array([2, 1])])]

    def infer(self, lp, targets, il, tl):
        _check(self, lp, targets, il, tl)
        n = None if lp.shape is None else (lp.shape[1],)
        return (TensorDesc(n, lp.dtype, lp.device),)

    def cpu(self, lp, targets, il, tl):
        _check_ctc_values(self, lp, targets, il, tl)
        T, N, C, L, il, tl, ext, lpe, skip = _ctc_setup(lp, targets, il, tl, self.blank)
        return _ctc_nll(_ctc_alpha(lpe, skip, T, N, L, self.floor), il, tl, N).astype(lp.dtype)

    def vjp(self, inputs, outputs, grads):
        (lp, targets, il, tl), (nll,), (g,) = inputs, outputs, grads
        (d,) = apply(CTCLossGrad(self.blank, self.floor), lp, targets, il, tl, nll, g)
        return [d, None, None, None]

    def cuda(self, be, lp, targets, il, tl):
        # a host copy of the labels and lengths (a synchronization: they are small)
        _check_ctc_values(self, lp, _host(targets), _host(il), _host(tl))
        return _ctc_launch(self, be, lp, targets, il, tl)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_ctcloss_<ctype>(lp, targets, il, tl, nll, work, T, N, C, S, blank, floor)``:
        one thread per sample, the alpha recursion in log space over a
        (N, 2, 2S+1) workspace of two rows; lengths and targets int64."""
        return _ctc_source(ctype, backward=False)


class CTCLossGrad(Op):
    """(log_probs, targets, input_lengths, target_lengths, nll, g) -> the
    gradient of sum(g * nll) with respect to log_probs (T, N, C).
    Declares no gradient of its own (as PyTorch's ctc_loss: no double backward)."""
    name = "CTCLossGrad"
    devices = ("cpu", "cuda")
    attrs = ("blank", "floor")

    def __init__(self, blank: int = 0, floor: float = -math.inf):
        self.blank, self.floor = int(blank), float(floor)

    @classmethod
    def examples(cls):
        """Sample inputs for ``check_op`` (the nll of CTCLoss's example)."""
        (op, (lp, t, il, tl)), = CTCLoss.examples()
        nll = CTCLoss(0).cpu(lp, t, il, tl)
        return [(cls(0), [lp, t, il, tl, nll, np.array([1.0, 0.5])])]

    def infer(self, lp, targets, il, tl, nll, g):
        _check(self, lp, targets, il, tl, nll, g)
        if lp.shape is not None and nll.shape is not None and g.shape is not None:
            if tuple(nll.shape) != (lp.shape[1],) or tuple(g.shape) != (lp.shape[1],):
                raise self.error(f"nll and g must be ({lp.shape[1]},)", lp, targets, il, tl, nll, g)
        return (TensorDesc(lp.shape, lp.dtype, lp.device),)

    def cpu(self, lp, targets, il, tl, nll, g):
        T, N, C, L, il, tl, ext, lpe, skip = _ctc_setup(lp, targets, il, tl, self.blank)
        alpha = _ctc_alpha(lpe, skip, T, N, L, self.floor)
        beta = np.full((T, N, L), -np.inf, lp.dtype)
        n = np.arange(N)
        neg = np.full((N, 1), -np.inf, lp.dtype)
        skip2 = np.concatenate([skip[:, 2:], np.zeros((N, 2), bool)], 1)   # skip of s + 2
        for t in range(T - 1, -1, -1):
            if t < T - 1:
                b = beta[t + 1]
                b1 = np.concatenate([b[:, 1:], neg], 1)
                b2 = np.where(skip2, np.concatenate([b[:, 2:], neg, neg], 1)[:, :L], -np.inf)
                beta[t] = np.where((t < il - 1)[:, None], _lse(b, b1, b2) + lpe[t], -np.inf)
            start = (il - 1 == t)
            if start.any():
                k = n[start]
                beta[t, k, 2 * tl[k]] = lpe[t, k, 2 * tl[k]]
                has = k[tl[k] > 0]
                beta[t, has, 2 * tl[has] - 1] = lpe[t, has, 2 * tl[has] - 1]
        nll = np.asarray(nll, lp.dtype)
        ok = np.isfinite(nll)
        with np.errstate(invalid="ignore", over="ignore"):
            occ = np.exp(alpha + beta - lpe + np.where(ok, nll, 0)[None, :, None])
        occ = np.where(np.isfinite(alpha + beta)[...] & ok[None, :, None], occ, 0.0)
        if T:
            occ[0, :, 2:] = 0.0         # a floor start depends on no log-probability
        onehot = (ext[:, :, None] == np.arange(C)[None, None, :]).astype(lp.dtype)   # (N, L, C)
        grad = -np.einsum("tns,nsc->tnc", occ, onehot)
        return (grad * np.asarray(g, lp.dtype)[None, :, None]).astype(lp.dtype)

    def cuda(self, be, lp, targets, il, tl, nll, g):
        return _ctc_launch(self, be, lp, targets, il, tl, nll, g)

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_ctclossgrad_<ctype>(lp, targets, il, tl, nll, g, grad, work, T, N, C, S, blank, floor)``:
        one thread per sample: alpha forward into a (N, T, 2S+1) workspace,
        then beta backward (two rows) accumulating the gradient of its
        (T, C) slice, zeroed first."""
        return _ctc_source(ctype, backward=True)


def _ctc_launch(op, be, lp, targets, il, tl, nll=None, g=None):
    if lp.dtype not in (np.float32, np.float64):
        raise op.error(f"the CUDA kernel takes float32 or float64 log_probs, got {lp.dtype}",
                       TensorDesc(lp.shape, lp.dtype, "cuda"))
    T, N, C = lp.shape
    S = targets.shape[1]
    L = 2 * S + 1
    targets, il, tl = (be.cast(a, np.dtype("int64")) for a in (targets, il, tl))
    T_ = be.ctype(lp.dtype)
    if nll is None:
        out = be.empty((N,), lp.dtype)
        work = be.empty((max(N * 2 * L, 1),), lp.dtype)
        if N:
            be.launch_n(be.kernel(op, T_), N, lp, targets, il, tl, out, work, T, N, C, S, op.blank,
                        lp.dtype.type(op.floor))
        return out
    out = be.empty((T, N, C), lp.dtype)
    work = be.empty((max(N * (T + 2) * L, 1),), lp.dtype)
    if N:
        be.launch_n(be.kernel(op, T_), N, lp, targets, il, tl, nll, g, out, work, T, N, C, S, op.blank,
                    lp.dtype.type(op.floor))
    return out


# the CTC kernels: one thread per sample n (a grid-stride loop over N); the
# label of extended position s for sample n, its log prob at t, and whether
# s may be reached from s - 2
_CTC_HELPERS = r"""
#ifndef GC_CTC_HELPERS
#define GC_CTC_HELPERS
template <class V> static __device__ V gc_ctc_lse(V a, V b) {
    if (isinf(a) && a < 0) return b;
    if (isinf(b) && b < 0) return a;
    V m = a > b ? a : b;
    return m + log(exp(a - m) + exp(b - m));
}
#define GC_LAB(s) ((s) % 2 == 0 ? blank : (targets[n * S + (s) / 2] < 0 ? 0 : \
    (targets[n * S + (s) / 2] >= C ? C - 1 : targets[n * S + (s) / 2])))
#define GC_LP(t, s) lp[((t) * N + n) * C + GC_LAB(s)]
#define GC_SKIP(s) ((s) >= 2 && GC_LAB(s) != GC_LAB((s) - 2))
#endif
"""
_CTC = Kernel('ctcloss', 'const T* __restrict__ lp, const long long* __restrict__ targets, '
              'const long long* __restrict__ il, const long long* __restrict__ tl, T* __restrict__ nll, '
              'T* __restrict__ work, long long Tmax, long long N, long long C, long long S, long long blank, T floor', """
    const T NEG = -INFINITY;
    long long Tn = il[n] < 0 ? 0 : (il[n] > Tmax ? Tmax : il[n]);
    long long Sn = tl[n] < 0 ? 0 : (tl[n] > S ? S : tl[n]);
    const long long Ln = 2 * Sn + 1, LL = 2 * S + 1;
    T* a0 = work + n * 2 * LL; T* a1 = a0 + LL;
    if (Tn == 0) { nll[n] = Sn == 0 ? 0 : INFINITY; continue; }
    for (long long s = 0; s < Ln; ++s) a0[s] = s < 2 ? GC_LP(0, s) : floor;
    for (long long t = 1; t < Tn; ++t) {
        for (long long s = 0; s < Ln; ++s) {
            T v = a0[s];
            if (s >= 1) v = gc_ctc_lse(v, a0[s - 1]);
            if (GC_SKIP(s)) v = gc_ctc_lse(v, a0[s - 2]);
            a1[s] = v + GC_LP(t, s);
        }
        T* tmp = a0; a0 = a1; a1 = tmp;
    }
    T ll = a0[Ln - 1];
    if (Sn > 0) ll = gc_ctc_lse(ll, a0[Ln - 2]);
    nll[n] = -ll;""", over="N", index="n")
_CTC_GRAD = Kernel('ctclossgrad', 'const T* __restrict__ lp, const long long* __restrict__ targets, '
                   'const long long* __restrict__ il, const long long* __restrict__ tl, const T* __restrict__ nll, '
                   'const T* __restrict__ g, T* __restrict__ grad, T* __restrict__ work, long long Tmax, '
                   'long long N, long long C, long long S, long long blank, T floor', """
    const T NEG = -INFINITY;
    long long Tn = il[n] < 0 ? 0 : (il[n] > Tmax ? Tmax : il[n]);
    long long Sn = tl[n] < 0 ? 0 : (tl[n] > S ? S : tl[n]);
    const long long Ln = 2 * Sn + 1, LL = 2 * S + 1;
    for (long long t = 0; t < Tmax; ++t) for (long long k = 0; k < C; ++k) grad[(t * N + n) * C + k] = 0;
    const T total = nll[n];
    if (Tn == 0 || isinf(total) || isnan(total)) continue;
    T* alpha = work + n * (Tmax + 2) * LL;
    T* b0 = alpha + Tmax * LL; T* b1 = b0 + LL;
    for (long long s = 0; s < Ln; ++s) alpha[s] = s < 2 ? GC_LP(0, s) : floor;
    for (long long t = 1; t < Tn; ++t)
        for (long long s = 0; s < Ln; ++s) {
            T v = alpha[(t - 1) * LL + s];
            if (s >= 1) v = gc_ctc_lse(v, alpha[(t - 1) * LL + s - 1]);
            if (GC_SKIP(s)) v = gc_ctc_lse(v, alpha[(t - 1) * LL + s - 2]);
            alpha[t * LL + s] = v + GC_LP(t, s);
        }
    for (long long s = 0; s < Ln; ++s) b0[s] = (s == Ln - 1 || (Sn > 0 && s == Ln - 2)) ? GC_LP(Tn - 1, s) : NEG;
    for (long long t = Tn - 1; t >= 0; --t) {
        if (t < Tn - 1) {
            for (long long s = 0; s < Ln; ++s) {
                T v = b0[s];
                if (s + 1 < Ln) v = gc_ctc_lse(v, b0[s + 1]);
                if (s + 2 < Ln && GC_SKIP(s + 2)) v = gc_ctc_lse(v, b0[s + 2]);
                b1[s] = v + GC_LP(t, s);
            }
            T* tmp = b0; b0 = b1; b1 = tmp;
        }
        for (long long s = 0; s < Ln; ++s) {
            const T ab = alpha[t * LL + s] + b0[s];
            if (isinf(ab) || (t == 0 && s >= 2)) continue;      // (a floor start depends on no log prob)
            grad[(t * N + n) * C + GC_LAB(s)] -= g[n] * exp(ab - GC_LP(t, s) + total);
        }
    }""", over="N", index="n")

def _ctc_source(ctype: str, backward: bool) -> str:
    return (_CTC_GRAD if backward else _CTC).source(ctype, helpers=_CTC_HELPERS)
