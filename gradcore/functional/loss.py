"""The losses, ``F.loss`` (MegEngine's module of that name; ``F.nn`` and
``F`` re-export them), ``reduction`` "mean", "sum" or "none": MegEngine's
cross_entropy, l1_loss, square_loss, binary_cross_entropy, hinge_loss and
ctc_loss, and (PyTorch's numerics) nll_loss, smooth_l1_loss, kl_div and
cosine_similarity. cross_entropy on logits runs the fused CrossEntropy op and
ctc_loss the CTCLoss op (ops/loss.py); the others are compositions of
existing ops (their gradients, of any order, come from those).

Example::

    >>> logp = F.log_softmax(gc.tensor([[1.0, 2.0, 3.0]]), 1)
    >>> round(F.nn.nll_loss(logp, gc.tensor([2])).item(), 4)
    0.4076
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .._core import Tensor, apply as _apply
from ..dtypes import DEFAULT_FLOAT, category
from ..op import OpError
from ..ops.indexing import IndexingOneHot
from ..ops.loss import CrossEntropy as _CrossEntropy, CTCLoss
from ..ops.nn import LogSoftmax
from ._args import _axis_in, _named, _on, _t
from .elemwise import where
from .elemwise_table import abs, log, maximum, relu, softplus, sqrt, square
from .indexing import _int_labels, indexing_one_hot
from .reduce import mean, sum
from .shape import astype, broadcast_to, expand_dims
from ..op import ArgumentError

__all__ = ["l1_loss", "square_loss", "cross_entropy", "binary_cross_entropy", "hinge_loss", "ctc_loss",
           "nll_loss", "smooth_l1_loss", "kl_div", "cosine_similarity", "mse_loss"]


def _reduce_loss(name: str, loss: Tensor, reduction: str) -> Tensor:
    """Every loss's ``reduction``: "mean" or "sum" over all elements, or
    "none" (the elementwise loss as is)."""
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    if reduction == "none":
        return loss
    raise ArgumentError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _same_shape(name: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        try:
            ok = tuple(np.broadcast_shapes(a.shape, b.shape)) == tuple(a.shape)
        except ValueError:
            ok = False
        if not ok:
            raise ArgumentError(f"{name}: target must have input's shape (or broadcast to it), got shapes "
                             f"{a.shape} and {b.shape}")


def nll_loss(input: Tensor, target: Tensor, weight: Optional[Tensor] = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """Negative log likelihood of log-probabilities ``input`` (N, C) or (N,
    C, d1, ...) (or (C,) with a 0-d target) at the integer classes
    ``target`` (N,) or (N, d1, ...): ``-weight[t] * input[n, t]``; entries
    equal to ``ignore_index`` count for nothing. "mean" divides by the sum of
    the weights of the counted entries (PyTorch's).

    Example::

        >>> logp = F.log_softmax(gc.tensor([[0.0, 0.0], [0.0, 0.0]]), 1)
        >>> round(F.nn.nll_loss(logp, gc.tensor([0, 1]), reduction="sum").item(), 4)     # 2 log 2
        1.3863
    """
    x = _t(input)
    t = _int_labels(_on(target, x), "nll_loss", "target")
    if x.ndim < 1 or t.ndim != max(x.ndim - 1, 0) or (x.ndim > 1 and (t.shape[0] != x.shape[0]
                                                                         or t.shape[1:] != x.shape[2:])):
        raise ArgumentError(f"nll_loss: expected input (N, C, ...) and target (N, ...), got shapes {x.shape} "
                         f"and {t.shape}")
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    axis = 1 if x.ndim > 1 else 0
    C = x.shape[axis]
    if t.device == "cpu":
        return _nll_loss_host_labels(x, t, weight, ignore_index, reduction, C)
    keep = t != ignore_index
    safe = where(keep, t, 0)
    picked = _picked(x, safe)
    w = astype(keep, x.dtype)
    if weight is not None:
        w = w * _class_weight(weight, x, C)[safe.reshape(-1)].reshape(t.shape)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return sum(loss)
    total = sum(w)
    none_kept = total == 0
    # every target ignored: NaN, as PyTorch's, but zero gradients (not 0 / 0)
    return sum(loss) / where(none_kept, 1, total) + where(none_kept, np.asarray(np.nan, total.dtype), 0)


def _picked(x: Tensor, safe) -> Tensor:
    """``x[n, safe[n], ...]`` along axis 1 (x (C,): its entry at the 0-d
    ``safe``); ``safe`` integer class indices on x's device."""
    if x.ndim == 1:
        return indexing_one_hot(expand_dims(x, 0), expand_dims(safe, 0), 1)[0]
    # the op itself (F.indexing_one_hot's argument checks are a third of its cost)
    return _apply(_PICK, x, safe)[0]


_PICK = IndexingOneHot(1, False)


def _class_weight(weight, x: Tensor, C: int) -> Tensor:
    wt = _t(weight, x)
    if wt.shape != (C,):
        raise ArgumentError(f"nll_loss: weight must be ({C},) (one per class), got shape {wt.shape}")
    return wt


def _nll_loss_host_labels(x: Tensor, t: Tensor, weight, ignore_index: int, reduction: str, C: int) -> Tensor:
    """nll_loss with the labels on the host: which entries count, the safe
    labels and (unweighted) the count the mean divides by are NumPy
    constants, not ops (the same values and bits as the composed ops: the
    per-op cost of ~10 small ops was most of the loss's time)."""
    labels = t.numpy()
    if labels.size and 0 <= labels.min() and labels.max() < C and not 0 <= ignore_index < C:
        # every label in range, none ignored (the usual case): no mask, and
        # the count is the size (both as the general path would give them)
        keep, safe = None, labels
    else:
        keep = labels != ignore_index
        safe = np.where(keep, labels, 0).astype(labels.dtype, copy=False)
        if safe.size and (safe.min() < 0 or safe.max() >= C):
            raise IndexError(f"nll_loss: target values must be in [0, {C}) or ignore_index={ignore_index}, "
                             f"got {safe.min()}..{safe.max()} (input shape {x.shape}, target shape {t.shape})")
    # the constants as Tensors (an op takes a NumPy operand by a slower path)
    picked = _picked(x, Tensor(safe))
    # (no mask: its ones leave every product as it is)
    w = None if keep is None else keep.astype(x.dtype)
    if weight is not None:
        per_class = _class_weight(weight, x, C)[Tensor(safe.reshape(-1))].reshape(t.shape)
        w = per_class if w is None else per_class * Tensor(w)
        loss = -picked * w
    else:
        loss = -picked if w is None else picked * Tensor(-w)     # -(p * w) exactly: only the sign differs
    if reduction == "none":
        return loss
    if reduction == "sum":
        return sum(loss)
    if weight is not None:
        total = sum(w)
        none_kept = total == 0
        return sum(loss) / where(none_kept, 1, total) + where(none_kept, np.asarray(np.nan, total.dtype), 0)
    # the count in x's dtype, as the tensor sum gave it (a whole number: the
    # Python float of it divides to the same bits)
    total = float(w.sum(dtype=w.dtype)) if w is not None else _count(labels.size, x.dtype)
    # every target ignored: NaN, as PyTorch's, but zero gradients (not 0 / 0)
    return sum(loss) + float("nan") if total == 0 else sum(loss) / total


def _count(n: int, dtype) -> float:
    """n as the sum of n ones in ``dtype`` gives it (exact for float32 and
    float64 up to 2**24; a narrower float rounds the sum)."""
    if np.dtype(dtype).itemsize >= 4 and n <= 2 ** 24:
        return float(n)
    return float(np.ones(n, dtype).sum(dtype=dtype))


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """Huber-like loss: ``0.5 * d**2 / beta`` where ``|d| < beta``, else
    ``|d| - 0.5 * beta`` (d = input - target; beta 0 gives the L1 loss).

    Example::

        >>> F.nn.smooth_l1_loss(gc.tensor([0.5, 3.0]), gc.tensor([0.0, 0.0]), reduction="none").numpy()
        array([0.125, 2.5  ], dtype=float32)
    """
    x = _t(input)
    y = astype(_t(target, x), x.dtype)
    _same_shape("smooth_l1_loss", x, y)
    if not beta >= 0:
        raise ArgumentError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    diff = x - y
    d = abs(diff)
    if beta == 0:
        return _reduce_loss("smooth_l1_loss", d, reduction)
    # the square of the difference itself, not of |d|: abs's zero slope at 0
    # would zero the second derivative there (PyTorch's is 1 / beta)
    loss = where(d < beta, diff * diff * (0.5 / beta), d - 0.5 * beta)
    return _reduce_loss("smooth_l1_loss", loss, reduction)


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """Kullback-Leibler divergence with ``input`` holding log-probabilities:
    ``target * (log(target) - input)`` pointwise (0 where target is 0), or
    ``exp(target) * (target - input)`` with ``log_target``. ``reduction``:
    "mean" (over every element, PyTorch's default), "batchmean" (sum / N),
    "sum" or "none".

    Example::

        >>> p = gc.tensor([[0.5, 0.5]])
        >>> F.nn.kl_div(F.log(p), p, reduction="batchmean").item()
        0.0
        >>> round(F.nn.kl_div(F.log(gc.tensor([[0.25, 0.75]])), p, reduction="sum").item(), 4)
        0.1438
    """
    x = _t(input)
    y = astype(_t(target, x), x.dtype)
    _same_shape("kl_div", x, y)
    if log_target:
        from .elemwise_table import exp
        loss = exp(y) * (y - x)
    else:
        pos = y > 0
        loss = where(pos, y * log(where(pos, y, 1.0)), 0.0) - y * x
    if reduction == "batchmean":
        return sum(loss) / (x.shape[0] if x.ndim else 1)
    return _reduce_loss("kl_div", loss, reduction)


def cosine_similarity(x1: Tensor, x2: Tensor, axis: int = 1, eps: float = 1e-8) -> Tensor:
    """Cosine of the angle between ``x1`` and ``x2`` along ``axis`` (they
    broadcast): ``sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps))``, PyTorch's
    formula (each norm clamped at ``eps``).

    Example::

        >>> F.nn.cosine_similarity(gc.tensor([[1.0, 0.0]]), gc.tensor([[1.0, 1.0]])).numpy()
        array([0.70710677], dtype=float32)
    """
    a, b = _t(x1), _t(x2, x1)
    try:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ArgumentError(f"cosine_similarity: x1 and x2 must broadcast, got shapes {a.shape} and {b.shape}") \
            from None
    if not -len(shape) <= axis < max(len(shape), 1):
        raise ArgumentError(f"cosine_similarity: axis {axis} is out of range for shape {shape}")
    # clamped inside the root: a zero vector's norm is eps with a zero
    # gradient (outside, the root's infinite slope at 0 gives NaN)
    # the norms of the broadcast operands (a lower-rank x2 has no axis of its own)
    a, b = broadcast_to(a, shape), broadcast_to(b, shape)
    na = sqrt(maximum(sum(a * a, axis, True), eps * eps))
    nb = sqrt(maximum(sum(b * b, axis, True), eps * eps))
    return sum((a / na) * (b / nb), axis)


def ctc_loss(pred: Tensor, pred_lengths: Tensor, label: Tensor, label_lengths: Tensor, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """Connectionist temporal classification loss, MegEngine's
    ``F.nn.ctc_loss``: ``pred`` (T, N, C) the probabilities (a softmax's
    output; their log is taken at no less than float32's tiniest number),
    ``pred_lengths`` (N,), ``label`` (N, S) padded or 1-D concatenated
    (sum(label_lengths),), ``label_lengths`` (N,). "mean" divides each
    sample's loss by its label length, then averages (as PyTorch's
    ``ctc_loss`` on the log-probabilities does). As MegEngine's, a label no
    alignment can produce gets a large finite loss (every path starts from
    at least float32's tiniest probability), where PyTorch's is inf; for
    the others the values are PyTorch's. ``zero_infinity`` (PyTorch's)
    turns infinite losses and their gradients into 0.

    Example::

        >>> pred = gc.tensor([[[0.0614, 0.9386], [0.8812, 0.1188]], [[0.699, 0.301], [0.2572, 0.7428]]])
        >>> loss = F.nn.ctc_loss(pred, gc.tensor([2, 2]), gc.tensor([1, 1]), gc.tensor([1, 1]))
        >>> round(loss.item(), 5)
        0.15044
    """
    p = _t(pred)
    if p.ndim != 3:
        raise ArgumentError(f"ctc_loss: pred must be (T, N, C), got shape {p.shape}")
    # MegEngine's recursion starts the states no alignment starts in at
    # log(tiny) too: an impossible label gets a large finite loss, not inf.
    # float32's tiny whatever the dtype: MegEngine computes in float32, and a
    # float64 run gives its losses
    tiny = float(np.finfo(np.float32).tiny)
    return _ctc_of_log_probs(log(maximum(p, tiny)), label, pred_lengths, label_lengths, blank, reduction,
                             zero_infinity, floor=float(np.log(tiny)))


def _ctc_of_log_probs(log_probs: Tensor, targets, input_lengths, target_lengths, blank: int,
                      reduction: str, zero_infinity: bool, floor: float = float("-inf")) -> Tensor:
    """The CTC loss of log-probabilities (T, N, C), in PyTorch's argument
    order: what ``ctc_loss`` computes after taking its ``pred``'s log."""
    lp = _t(log_probs)
    if lp.ndim != 3:
        raise ArgumentError(f"ctc_loss: pred must be (T, N, C), got shape {lp.shape}")
    N = lp.shape[1]
    def ints(v):
        return v if isinstance(v, Tensor) else Tensor(np.asarray(v, np.int64), device=lp.device)
    il, tl = astype(ints(input_lengths), "int64"), astype(ints(target_lengths), "int64")
    for what, v in (("pred_lengths", il), ("label_lengths", tl)):
        if v.dtype.kind not in "iu" or v.device != lp.device:
            raise TypeError(f"ctc_loss: {what} must be integers on {lp.device}, got {v.dtype} on {v.device}")
    tg = targets if isinstance(targets, Tensor) else Tensor(np.asarray(targets, np.int64))
    if tg.dtype.kind not in "iu":
        raise TypeError(f"ctc_loss: label must be an integer tensor, got {tg.dtype}")
    if tg.ndim == 1:       # concatenated: pad on the host
        lens = tl.numpy().astype(np.int64)
        flat = tg.numpy()
        if lens.sum() != flat.size:
            raise ArgumentError(f"ctc_loss: a 1-D label must hold sum(label_lengths) = {lens.sum()} labels, "
                             f"got {flat.size}")
        pad = np.zeros((N, max(int(lens.max(initial=0)), 1)), np.int64)
        ends = np.cumsum(lens)
        for n in range(N):
            pad[n, :lens[n]] = flat[ends[n] - lens[n]:ends[n]]
        tg = Tensor(pad)
    tg = astype(_on(tg, lp), "int64")
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"ctc_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if il.shape != (N,) or tl.shape != (N,) or tg.ndim != 2 or tg.shape[0] != N:
        raise ArgumentError(f"ctc_loss: for pred {lp.shape}, expected label ({N}, S) and lengths ({N},), "
                         f"got {tg.shape}, {il.shape} and {tl.shape}")
    if not 0 <= blank < lp.shape[2]:
        raise ArgumentError(f"ctc_loss: blank {blank} is not a class of pred {lp.shape}")
    loss = _apply(CTCLoss(blank, floor), lp, tg, il, tl)[0]
    if zero_infinity:
        loss = where(loss == float("inf"), 0.0, loss)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return sum(loss)
    return mean(loss / astype(maximum(tl, 1), lp.dtype))


# ---- losses: ``reduction`` is "mean" (default), "sum" or "none"
def cross_entropy(pred: Tensor, label: Tensor, axis: int = 1, with_logits: bool = True,
                  label_smooth: float = 0.0, reduction: str = "mean") -> Tensor:
    """Cross-entropy of class scores ``pred`` (logits by default) against
    integer ``label``, MegEngine's ``F.nn.cross_entropy``: per sample
    ``-log softmax(pred)[label]`` along ``axis``, with ``label_smooth`` a
    mixes in ``-mean(log softmax(pred))``: ``(1 - a) * nll - a * mean``;
    then ``reduction`` ("mean", "sum" or "none").

    Logits run as one fused op, ``CrossEntropy`` (ops/loss.py; label
    smoothing included), and its gradient as one more; probabilities
    (``with_logits=False``) and integer scores take the composed path
    (log, indexing_one_hot, negation). Labels must be in [0, n): out of
    range is an IndexError (on cuda too, from the labels' range, read once
    per content), a negative one on the cpu a ValueError.

    Example::

        >>> logits = gc.tensor([[0.0, 0.0], [0.0, 0.0]])
        >>> round(F.cross_entropy(logits, gc.tensor([1, 0])).item(), 4)     # log 2
        0.6931
    """
    pred = _t(pred)
    label = _on(label, pred)
    label = _int_labels(label, "cross_entropy", "label")
    if isinstance(label, Tensor) and label.device == "cpu" and label.size and label.numpy().min() < 0:
        # indexing would count a negative class from the end (NumPy's rule) and
        # score the wrong class silently; on cuda this check would cost a sync
        raise ArgumentError(f"cross_entropy: labels must be class indices >= 0, got {label.numpy().min()} "
                         f"(label shape {label.shape}, pred shape {pred.shape})")
    if label.ndim != pred.ndim - 1:
        raise ArgumentError(f"cross_entropy: label must have one dimension less than pred, "
                         f"got shapes {pred.shape} and {label.shape}")
    if pred.shape is not None:
        axis = _axis_in("cross_entropy", axis, pred.ndim)
    if label_smooth is None:        # MegEngine: None is no smoothing
        label_smooth = 0.0
    if isinstance(label_smooth, bool) or not isinstance(label_smooth, (int, float, np.number)):
        raise TypeError(f"cross_entropy: label_smooth must be a number, got {label_smooth!r}")
    if with_logits and pred.dtype.kind == "f":
        try:
            nll = _apply(_CrossEntropy(axis, label_smooth), pred, label)[0]
        except (OpError, IndexError) as exc:     # a label out of range, a shape
            raise _named("cross_entropy", exc) from exc
        return _reduce_loss("cross_entropy", nll, reduction)
    logp = _apply(LogSoftmax(axis), pred)[0] if with_logits else log(pred)
    try:
        nll = -indexing_one_hot(logp, label, axis)
    except (OpError, IndexError) as exc:         # a label out of range
        raise _named("cross_entropy", exc) from exc
    if label_smooth:
        nll = nll * (1 - label_smooth) - mean(logp, axis) * label_smooth
    return _reduce_loss("cross_entropy", nll, reduction)


def _label(label, pred: Tensor, name: Optional[str] = None) -> Tensor:
    """``label`` as a tensor of ``pred``'s dtype: the loss keeps ``pred``'s.
    With ``name`` (a loss), ``label`` must broadcast to ``pred``'s shape (a
    (N,) label against (N, 1) scores would silently make an (N, N) loss)."""
    label = astype(_t(label, pred), pred.dtype)
    if name is not None and label.shape != pred.shape and label.shape is not None and pred.shape is not None:
        try:
            shape = tuple(np.broadcast_shapes(pred.shape, label.shape))
        except ValueError:
            shape = None
        if shape != pred.shape:
            raise ArgumentError(f"{name}: label must have pred's shape (or broadcast to it), got shapes "
                             f"{pred.shape} and {label.shape}")
    return label


def l1_loss(pred: Tensor, label: Tensor, reduction: str = "mean") -> Tensor:
    """Mean absolute error, ``|pred - label|`` reduced.

    Example::

        >>> F.l1_loss(gc.tensor([3.0, 3.0]), gc.tensor([2.0, 8.0])).item()
        3.0
    """
    pred = _t(pred)
    return _reduce_loss("l1_loss", abs(pred - _label(label, pred, "l1_loss")), reduction)


def square_loss(pred: Tensor, label: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error, ``(pred - label) ** 2`` reduced (also ``F.mse_loss``).

    Example::

        >>> F.square_loss(gc.tensor([3.0, 3.0]), gc.tensor([2.0, 8.0])).item()
        13.0
        >>> F.square_loss(gc.tensor([3, 3]), gc.tensor([2, 8]), reduction="none")  # integers: float32
        Tensor([ 1., 25.], dtype=float32, device=cpu)
    """
    pred = _t(pred)
    diff = pred - _label(label, pred, "square_loss")
    if category(diff.dtype) < 2:
        # MegEngine squares with ``diff ** 2``, and a power of integers is float32
        diff = astype(diff, DEFAULT_FLOAT)
    return _reduce_loss("square_loss", square(diff), reduction)


mse_loss = square_loss


def binary_cross_entropy(pred: Tensor, label: Tensor, with_logits: bool = True,
                         reduction: str = "mean") -> Tensor:
    """Binary cross-entropy of ``pred`` against probabilities ``label`` (same
    shape). ``pred`` holds logits by default (computed stably as
    ``softplus(-pred) + (1 - label) * pred``); with ``with_logits=False`` it
    holds probabilities in (0, 1).

    Example::

        >>> F.binary_cross_entropy(gc.tensor([0.0, 0.0]), gc.tensor([1.0, 0.0])).item()
        0.6931471824645996
    """
    pred = _t(pred)
    label = _label(label, pred, "binary_cross_entropy")
    if with_logits:
        loss = softplus(-pred) + (1 - label) * pred
    else:
        # each log at no less than -100, as PyTorch's: a probability of
        # exactly 0 or 1 gives a large finite loss, not inf or NaN (the log
        # of a stand-in there, so that no 0 * inf reaches the gradient)
        def clamped_log(p):
            # (a NaN probability stays NaN, as PyTorch's clamp of its log)
            tiny = p <= np.exp(-100.0)
            return where(tiny, -100.0, log(where(tiny, 1.0, p)))
        loss = -(label * clamped_log(pred) + (1 - label) * clamped_log(1 - pred))
    return _reduce_loss("binary_cross_entropy", loss, reduction)


def hinge_loss(pred: Tensor, label: Tensor, norm: str = "L1", reduction: str = "mean") -> Tensor:
    """SVM hinge loss of scores ``pred`` (N, C) against labels of -1 or 1
    (same shape): per sample, the sum over axis 1 of ``max(0, 1 - pred *
    label)`` ("L1") or of its square ("L2"); then ``reduction`` over samples.

    Example::

        >>> pred = gc.tensor([[0.5, -0.5, 0.1], [-0.6, 0.7, 0.8]])
        >>> F.hinge_loss(pred, gc.tensor([[1.0, -1, -1], [-1, 1, 1]]), reduction="none").numpy()
        array([2.1, 0.9], dtype=float32)
    """
    kind = norm.upper() if isinstance(norm, str) else norm
    if kind not in ("L1", "L2"):
        raise ArgumentError(f"hinge_loss: norm must be 'L1' or 'L2', got {norm!r}")
    pred = _t(pred)
    if pred.ndim < 2:
        raise ArgumentError(f"hinge_loss: pred must be (N, C, ...), got shape {pred.shape}")
    margin = relu(1 - pred * _label(label, pred, "hinge_loss"))
    loss = sum(margin if kind == "L1" else square(margin), 1)
    return _reduce_loss("hinge_loss", loss, reduction)
