"""Indexing: getitem and setitem (``x[i]``), gather, scatter, sort, topk
and the composites built on them (argsort, diag, cond_take, one_hot,
embedding). Their ops: ops/indexing.py.

Example::

    >>> F.gather(gc.tensor([[1.0, 2.0], [3.0, 4.0]]), 1, gc.tensor([[1], [0]])).numpy()
    array([[2.],
           [3.]], dtype=float32)
"""
from __future__ import annotations

import builtins
from typing import Any, Optional, Tuple, Union

import numpy as np

from .._core import Tensor, apply as _apply
from ..op import OpError
from ..ops.indexing import Gather, IndexingOneHot, Scatter, SetSubtensor, Sort, Subtensor, TopK, split_index
from ._args import _axis_in, _int_arg, _int_or_err, _named, _on, _t, builtins_max
from .creation import arange, zeros
from .elemwise_table import eq
from .shape import astype, concat, expand_dims, reshape, swapaxes
from ..op import ArgumentError


def getitem(x: Tensor, index: Any) -> Tensor:
    """``x[index]`` with NumPy's indexing rules (basic and advanced), recorded
    for the gradient; what ``Tensor.__getitem__`` calls.

    Example::

        >>> x = gc.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        >>> F.getitem(x, (slice(None), [2, 0])).numpy()     # x[:, [2, 0]]
        array([[3., 1.],
               [6., 4.]], dtype=float32)
    """
    spec, arrays = split_index(index)
    arrays = [_on(a if isinstance(a, Tensor) else np.asarray(a), x) for a in arrays]
    return _apply(Subtensor(spec), x, *arrays)[0]


def setitem(x: Tensor, index: Any, value: Union[Tensor, float, np.ndarray]) -> Tensor:
    """A copy of ``x`` with ``value`` written at ``index`` (recorded).

    Example::

        >>> x = gc.tensor([1.0, 2.0, 3.0])
        >>> F.setitem(x, 1, 0.0).numpy()
        array([1., 0., 3.], dtype=float32)
        >>> x.numpy()     # unchanged
        array([1., 2., 3.], dtype=float32)
    """
    spec, arrays = split_index(index)
    arrays = [_on(a if isinstance(a, Tensor) else np.asarray(a), x) for a in arrays]
    value = value if isinstance(value, Tensor) else _value_like("setitem", value, x)
    if value.dtype != x.dtype:
        value = astype(value, x.dtype)
    return _apply(SetSubtensor(spec), x, value, *arrays)[0]


def _value_like(name: str, value, x):
    """A non-Tensor ``value`` as a Tensor of ``x``'s dtype and device, or an
    error naming ``name`` (None would silently become NaN, a string a NumPy
    conversion error)."""
    if value is None:
        raise TypeError(f"{name}: the value is None; give a number or a tensor")
    try:
        if np.asarray(value).dtype.kind in "cO":
            # the cast would drop an imaginary part (or call float() on objects)
            raise TypeError(f"its dtype {np.asarray(value).dtype} is not a real number type")
        return Tensor(np.asarray(value, x.dtype), device=x.device)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: cannot use {type(value).__name__} {value!r:.60} as a value for a tensor "
                        f"of dtype {x.dtype} and shape {x.shape}: {exc}") from None


def indexing_one_hot(src: Tensor, index: Tensor, axis: int = 1, keepdims: bool = False) -> Tensor:
    """``src[i, index[i]]`` along ``axis``.

    Example::

        >>> logits = gc.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        >>> F.indexing_one_hot(logits, gc.tensor([2, 0])).numpy()
        array([3., 4.], dtype=float32)
    """
    src = _t(src)
    index = _int_labels(_on(index, src), "indexing_one_hot", "index")
    if src.shape is not None:
        _axis_in("indexing_one_hot", axis, src.ndim)      # no silent wrap of axis=5 onto axis 1
    return _apply(IndexingOneHot(_int_or_err("indexing_one_hot", "axis", axis), bool(keepdims)), src, index)[0]


def _int_labels(label, name: str, what: str):
    """Integer class indices; float ones holding whole numbers are cast to
    int32, as MegEngine does (its own examples pass float labels)."""
    kind = label.dtype.kind
    if kind in "iu":
        return label
    if kind != "f":
        raise TypeError(f"{name}: {what} must be an integer tensor, got {label.dtype} of shape {label.shape}")
    if isinstance(label, Tensor):
        values = label.numpy()
        if not np.all(np.isfinite(values) & (values == np.round(values))):
            raise TypeError(f"{name}: {what} must hold whole class indices, got {label.dtype} values "
                            f"that are not integers (shape {label.shape})")
    return astype(label, np.int32)


def gather(inp: Tensor, axis: int, index: Tensor) -> Tensor:
    """``out[i][j] = inp[i][index[i][j]]`` for axis 1 (torch.gather): ``index``
    is an integer tensor of ``inp``'s rank, no larger than ``inp`` outside
    ``axis``; the result has ``index``'s shape.

    Example::

        >>> x = gc.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> F.gather(x, 1, gc.tensor([[0, 0], [1, 0]])).numpy()
        array([[1., 1.],
               [4., 3.]], dtype=float32)
    """
    x = _t(inp)
    return _apply(Gather(_int_or_err("gather", "axis", axis)), x, _on(index, x))[0]


def scatter(inp: Tensor, axis: int, index: Tensor, source: Tensor) -> Tensor:
    """A copy of ``inp`` with ``out[i][index[i][j]] = source[i][j]`` for axis 1
    (torch.scatter, not accumulating). ``source`` is cast to ``inp``'s dtype.

    Example::

        >>> x = gc.tensor(np.zeros((2, 3), "float32"))
        >>> src = gc.tensor([[1.0, 2.0, 3.0]])
        >>> F.scatter(x, 0, gc.tensor([[1, 0, 1]]), src).numpy()
        array([[0., 2., 0.],
               [1., 0., 3.]], dtype=float32)
    """
    x = _t(inp)
    src = source if isinstance(source, Tensor) or hasattr(source, "trace") else _value_like("scatter", source, x)
    if src.dtype != x.dtype:
        src = astype(src, x.dtype)
    return _apply(Scatter(_int_or_err("scatter", "axis", axis)), x, _on(index, x), src)[0]


def sort(inp: Tensor, descending: bool = False, dim: int = -1, *, axis: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """``(sorted, indices)`` along ``dim`` (the last by default, as newer
    MegEngine's ``F.sort(inp, descending, dim)``; ``axis=`` is the same);
    a stable sort, indices int32.

    Example::

        >>> values, indices = F.sort(gc.tensor([3.0, 1.0, 2.0]), descending=True)
        >>> values.numpy(), indices.numpy()
        (array([3., 2., 1.], dtype=float32), array([0, 2, 1], dtype=int32))
    """
    x = _t(inp)
    axis = _int_or_err("sort", "axis" if axis is not None else "dim", dim if axis is None else axis)
    last = -1 if x.shape is None or x.ndim == 0 else x.ndim - 1
    ax = -1 if last < 0 or axis in (-1, last) else _axis_in("sort", axis, x.ndim)
    if ax in (-1, last):
        return _apply(Sort(bool(descending)), x)
    values, indices = _apply(Sort(bool(descending)), swapaxes(x, ax, -1))
    return swapaxes(values, ax, -1), swapaxes(indices, ax, -1)


def topk(inp: Tensor, k: int, descending: bool = True, kth_only: bool = False,
         no_sort: bool = False) -> Tuple[Tensor, Tensor]:
    """``(values, indices)`` of the ``k`` largest elements along the last
    axis (the smallest with ``descending=False``), MegEngine's ``F.topk``
    (whose default is the largest since MegEngine 1.12):
    ``kth_only`` returns only the k-th one (the last axis removed),
    ``no_sort`` returns them in index order. Indices are int32.

    Example::

        >>> values, indices = F.topk(gc.tensor([1.0, 4.0, 2.0, 3.0]), 2)
        >>> values.numpy(), indices.numpy()
        (array([4., 3.], dtype=float32), array([1, 3], dtype=int32))
    """
    mode = "kth_only" if kth_only else "no_sort" if no_sort else "sorted"
    return _apply(TopK(_int_or_err("topk", "k", k), bool(descending), mode), _t(inp))


# ---- composites
def argsort(inp: Tensor, descending: bool = False) -> Tensor:
    """The int32 indices that sort ``inp`` along its last axis (MegEngine's
    ``F.argsort``, for 1-d and 2-d input; any rank works here).

    Example::

        >>> F.argsort(gc.tensor([3.0, 1.0, 2.0])).numpy()
        array([1, 2, 0], dtype=int32)
    """
    return sort(inp, descending)[1]


def diag(inp: Tensor, k: int = 0) -> Tensor:
    """The ``k``-th diagonal of a 2-d ``inp`` (k > 0 above the main one), or
    the square 2-d tensor with the 1-d ``inp`` on its ``k``-th diagonal, as
    ``np.diag``.

    Example::

        >>> F.diag(gc.tensor([1, 2]), k=1).numpy()
        array([[0, 1, 0],
               [0, 0, 2],
               [0, 0, 0]], dtype=int32)
    """
    x = _t(inp)
    k = _int_arg("diag", "k", k, low=None)
    if x.ndim == 2:
        rows, cols = np.nonzero(np.eye(x.shape[0], x.shape[1], k, dtype=bool))
        return getitem(x, (rows, cols))
    if x.ndim != 1:
        raise ArgumentError(f"diag: inp must be 1-d or 2-d, got shape {x.shape}")
    # each cell picks an element of x, or the zero appended after them
    n = x.shape[0]
    i = np.arange(n)
    index = np.full((n + builtins.abs(k),) * 2, n)
    index[i + builtins_max(-k, 0), i + builtins_max(k, 0)] = i
    return getitem(concat([x, zeros((1,), dtype=x.dtype, device=x.device)]), index)


def cond_take(mask: Tensor, x: Tensor) -> tuple:
    """``(values, indices)``: the elements of ``x`` where the bool ``mask``
    (of ``x``'s shape) is true, and their int32 indices into the flattened
    ``x``; both 1-d (MegEngine's ``F.cond_take``).

    Example::

        >>> v, i = F.cond_take(gc.tensor([[True, False], [False, True]]), gc.tensor([[1.0, 2.0], [3.0, 4.0]]))
        >>> v.numpy(), i.numpy()
        (array([1., 4.], dtype=float32), array([0, 3], dtype=int32))
    """
    x = _t(x)
    m = _on(mask, x)
    if not isinstance(m, Tensor):
        raise TypeError("cond_take: mask must be a concrete tensor (its values decide the result's size)")
    if m.dtype != np.bool_:
        raise TypeError(f"cond_take: mask must be a bool tensor, got {m.dtype}")
    if m.shape != x.shape:
        raise ArgumentError(f"cond_take: mask and x must have the same shape, got {m.shape} and {x.shape}")
    index = np.flatnonzero(m.numpy()).astype(np.int32)
    return getitem(reshape(x, (-1,)), index), Tensor(index, device=x.device)


def non_zero(condition: Tensor, as_tuple: bool = False) -> Union[Tensor, Tuple[Tensor, ...]]:
    """The int32 indices of the nonzero (true) elements of ``condition``, in
    C order, MegEngine's ``F.non_zero``: one row per element, (count, ndim),
    or with ``as_tuple`` one 1-d tensor per dimension (as ``np.nonzero``).

    Example::

        >>> F.non_zero(gc.tensor([1, 1, 0, 1]), as_tuple=True)[0].numpy()
        array([0, 1, 3], dtype=int32)
    """
    if not isinstance(condition, Tensor):
        raise TypeError(f"non_zero: condition must be a Tensor, got {type(condition).__name__}")
    if condition.ndim == 0:
        # (NumPy's refusal, named)
        raise ArgumentError("non_zero: condition must have at least one dimension, got a 0-d tensor")
    found = np.nonzero(condition.numpy())
    if as_tuple:
        return tuple(Tensor(i.astype(np.int32), device=condition.device) for i in found)
    rows = np.stack(found, 1).astype(np.int32) if found else np.zeros((0, 0), np.int32)
    return Tensor(rows, device=condition.device)


def one_hot(inp: Tensor, num_classes: int) -> Tensor:
    """One-hot encoding of the integer tensor ``inp``: a new last axis of
    length ``num_classes``, 1 at each label's position; int32.

    Example::

        >>> F.one_hot(gc.tensor([1, 3]), 4).numpy()
        array([[0, 1, 0, 0],
               [0, 0, 0, 1]], dtype=int32)
    """
    num_classes = _int_arg("one_hot", "num_classes", num_classes, low=1)
    x = _on(inp, None)
    if x.dtype.kind not in "iu":
        raise TypeError(f"one_hot: inp must be an integer tensor, got {x.dtype}")
    if isinstance(x, Tensor) and x.size:     # concrete labels (not symbolic ones in a trace)
        values = x.numpy()
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= num_classes:
            raise ArgumentError(f"one_hot: labels must be in [0, {num_classes}), got values in [{lo}, {hi}]")
    try:
        classes = arange(num_classes, dtype=x.dtype, device=x.device)
        return astype(eq(expand_dims(x, -1), classes), "int32")
    except MemoryError:     # the inner arange/eq would name themselves, not the call the user made
        raise MemoryError(f"one_hot: num_classes={num_classes} for labels of shape {tuple(x.shape)} needs "
                          f"{4 * num_classes * max(x.size, 1) / 2**30:.3g} GiB, more than can be "
                          f"allocated") from None


def embedding(inp: Tensor, weight: Tensor, padding_idx: Optional[int] = None,
              max_norm: Optional[float] = None, norm_type: Optional[float] = None) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by the integer tensor
    ``inp``: the result has shape ``inp.shape + (dim,)``. As in MegEngine,
    ``padding_idx``, ``max_norm`` and ``norm_type`` must be None.

    Example::

        >>> w = gc.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
        >>> F.embedding(gc.tensor([[2, 0]]), w).shape
        (1, 2, 2)
    """
    if padding_idx is not None or max_norm is not None or norm_type is not None:
        raise ArgumentError("embedding: padding_idx, max_norm and norm_type are not supported (give None)")
    w = _t(weight)
    idx = _on(inp, w)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: inp must be an integer tensor, got {idx.dtype}")
    if w.ndim != 2:
        raise ArgumentError(f"embedding: weight must be 2-d (num_embeddings, dim), got shape {w.shape}")
    try:
        rows = getitem(w, reshape(idx, (-1,)))
    except (OpError, IndexError) as exc:      # an index >= num_embeddings
        raise _named("embedding", exc) from exc
    return reshape(rows, idx.shape + (w.shape[1],))
