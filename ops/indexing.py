"""Indexing: NumPy-style basic and advanced indexing, index assignment,
and indexing_one_hot (picking one element per row, as in cross-entropy).

An index is stored as a hashable "spec" (ints, slices, None, Ellipsis, and
``("t", k)`` placeholders); the index arrays themselves are extra inputs of
the op, so an op instance is shared by every call with the same index form.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from gradcore import _core
from gradcore.cpu import _kernels
from gradcore.cuda.kernels import Kernel
from gradcore.op import IndexOpError, Op, OpError, TensorDesc  # noqa: F401 (IndexOpError: here too)

from .shape import _DIMS, SumToLike, ZerosLike


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def split_index(index: Any) -> Tuple[tuple, list]:
    """(spec, index arrays) for a Python index expression.

    Example::

        >>> from gradcore.functional import split_index
        >>> split_index((slice(1, None), [0, 1]))     # the slice in the spec, the list an extra input
        ((('s', 1, None, None), ('t', 0)), [[0, 1]])
    """
    if not isinstance(index, tuple):
        index = (index,)
    spec, arrays = [], []
    for item in index:
        if item is None or item is Ellipsis:
            spec.append(item)
        elif isinstance(item, slice):
            spec.append(("s", _int_or_none(item.start), _int_or_none(item.stop), _int_or_none(item.step)))
        elif isinstance(item, (bool, np.bool_)):
            spec.append(("t", len(arrays)))
            arrays.append(np.asarray(item))
        elif isinstance(item, (int, np.integer)):
            spec.append(("i", int(item)))
        elif isinstance(item, _core.Tensor) and item.ndim == 0 and item.dtype.kind in "iu":
            spec.append(("i", int(item.item())))
        elif isinstance(item, (list, tuple)) and _empty_sequence(item):
            # NumPy: an empty list (x[[]], x[[], []]) is an empty integer
            # index, not a float array
            spec.append(("t", len(arrays)))
            arrays.append(np.asarray(item, dtype=np.intp))
        else:
            spec.append(("t", len(arrays)))
            arrays.append(item)
    return tuple(spec), arrays


def _empty_sequence(item) -> bool:
    """A (nested) list or tuple holding no element at all."""
    try:
        arr = np.asarray(item)
    except Exception:
        return False
    return arr.size == 0 and arr.dtype.kind == "f"


def _int_or_none(v):
    # NumPy's rule: a slice bound is an int (or has __index__, as a 0-d
    # integer Tensor does), never a float truncated to one
    if v is None:
        return None
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"slice indices must be integers or None, got {v!r}") from None


def build_index(spec, arrays):
    out = []
    for item in spec:
        if item is None or item is Ellipsis:
            out.append(item)
        elif item[0] == "s":
            out.append(slice(item[1], item[2], item[3]))
        elif item[0] == "i":
            out.append(item[1])
        else:
            out.append(arrays[item[1]])
    return tuple(out)


def _has_arrays(spec):
    return any(isinstance(i, tuple) and i[0] == "t" for i in spec)


def _probe_shape(op, spec, shape, idx_descs, descs):
    """Result shape of indexing an array of ``shape``, found by indexing a
    zero-stride array (no data is touched)."""
    if shape is None or any(d.shape is None for d in idx_descs):
        return None
    probe = np.ndarray(shape, np.uint8, np.zeros(1, np.uint8), 0, (0,) * len(shape))
    arrays = [np.zeros(d.shape, d.dtype) for d in idx_descs]
    bad = next((d for d in idx_descs if d.dtype.kind not in "biu"), None)
    if bad is not None:
        # an IndexError, as NumPy raises for a float, string or object index
        raise IndexOpError(str(op.error(f"only integers, slices, ellipsis, None and integer or boolean "
                                        f"arrays are valid indices, got an index of dtype {bad.dtype}",
                                        *descs)))
    if any(d.dtype.kind == "b" for d in idx_descs):
        return None   # the result size depends on the mask's values
    try:
        return probe[build_index(spec, arrays)].shape
    except IndexError as exc:
        raise IndexOpError(str(op.error(str(exc), *descs))) from None
    except ValueError as exc:        # a slice step of 0: NumPy's ValueError, named
        raise op.error(str(exc), *descs) from None


# ---------------------------------------------------------------- cuda launch helpers
def _descs(*arrays):
    return [TensorDesc(a.shape, a.dtype, "cuda") for a in arrays]


def _host(a):
    """A host copy of an index array (a DeviceArray, or an ndarray already).
    Copying a device index means a synchronization; the index forms that need
    it (arrays, masks, range checks) are computed on the host for now."""
    return a if isinstance(a, np.ndarray) else a.get()


def _c_strides(shape):
    """Element strides of a C-contiguous array of ``shape``."""
    return tuple(int(math.prod(shape[d + 1:])) for d in range(len(shape)))


def _full_index(index):
    # a trailing Ellipsis makes NumPy return a 0-d array, never a scalar
    return index if any(i is Ellipsis for i in index) else index + (Ellipsis,)


def _basic_view(shape, spec):
    """(shape, element strides, element offset of the first element) of
    ``x[index]`` for a basic index: the view NumPy would make, found on a
    one-byte-per-element probe (no data is touched)."""
    probe = as_strided(np.zeros(1, np.uint8), shape, _c_strides(shape))
    view = probe[_full_index(build_index(spec, ()))]
    base = view.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
    return view.shape, view.strides, base


def _broadcast_strides(shape, to):
    """Element strides reading an array of ``shape`` broadcast to ``to`` (0 on
    broadcast axes)."""
    shape = _assigned_shape(shape, len(to))
    probe = as_strided(np.zeros(1, np.uint8), shape, _c_strides(shape))
    return np.broadcast_to(probe, to).strides


def _assigned_shape(shape, ndim):
    """An assigned value's shape without the leading dims beyond ``ndim`` (size
    1: NumPy's assignment drops them; infer checked that they are)."""
    return tuple(shape[len(shape) - ndim:]) if len(shape) > ndim else tuple(shape)


def _flat_offsets(shape, spec, idx):
    """The flat element offsets in a contiguous array of ``shape`` of the
    elements ``x[index]`` selects (an int64 array of the result's shape), for
    an index with arrays. Indexes zero-stride coordinate probes, one per axis,
    so it costs the result's size, never x's, and a bad index raises NumPy's
    own IndexError."""
    index = _full_index(build_index(spec, [_host(a) for a in idx]))
    zeros = (0,) * len(shape)
    offsets = np.array(as_strided(np.zeros(1, np.int64), shape, zeros)[index], np.int64)
    for d, (n, step) in enumerate(zip(shape, _c_strides(shape))):
        if n > 1:
            coord = as_strided(np.arange(n, dtype=np.int64), shape, zeros[:d] + (8,) + zeros[d + 1:])
            offsets += coord[index] * step
    return offsets


def _compact(shape, *strides):
    """(shape, strides...) without size-1 axes and with the axes that are
    contiguous in every stride list merged: fewer axes for the kernels'
    index arithmetic (and fewer than GC_MAX_DIMS in practice)."""
    dims, out = [], [[] for _ in strides]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if dims and all(o[-1] == st[d] * n for o, st in zip(out, strides)):
            dims[-1] *= n
            for o, st in zip(out, strides):
                o[-1] = st[d]
        else:
            dims.append(n)
            for o, st in zip(out, strides):
                o.append(st[d])
    return tuple(dims), [tuple(o) for o in out]


def _launch_strided(be, op, src, dst, shape, sstrides, sbase, dstrides, dbase):
    """dst[dbase + c . dstrides] = src[sbase + c . sstrides] for every
    coordinate c of ``shape``: ``op``'s _strided_source kernel."""
    n = int(math.prod(shape))
    if n == 0:
        return
    dims, (ss, ds) = _compact(shape, sstrides, dstrides)
    be.launch_n(be.kernel(op, be.ctype(dst.dtype)), n, src, dst, be.dims(dims), be.dims(ss), int(sbase),
                be.dims(ds), int(dbase))


def _on_device(be, a, dtype):
    """``a`` (a DeviceArray, or host data a tensor may hold) as a DeviceArray
    of ``dtype`` and of ``a``'s own shape (0-d included)."""
    out = be.asarray(a, dtype)
    return out if out.shape == a.shape else out.reshape(a.shape)


def _index32(be, index):
    """An index array as the kernels' int32 (cast on the device; the range is
    checked before, so no value wraps)."""
    return _on_device(be, index, np.int32)


def _outer_n_inner(shape, ax):
    return int(math.prod(shape[:ax])), int(shape[ax]), int(math.prod(shape[ax + 1:]))


class Subtensor(Op):
    """``x[index]``; index arrays are extra inputs. With ``last_only``, an
    element whose position the index selects again later is 0: the gradient
    of an assigned value (NumPy's last write wins, so an overwritten element
    of the value does not reach the result).

    Example::

        >>> from gradcore.functional import Subtensor, split_index
        >>> spec, arrays = split_index((slice(None), [2, 0]))
        >>> x = gc.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        >>> y, = gc.core.apply(Subtensor(spec), x, *[gc.tensor(a) for a in arrays])
        >>> y.numpy()
        array([[3., 1.],
               [6., 4.]], dtype=float32)
    """
    name = "Subtensor"
    reduce_broadcast = False
    check_params = ({"spec": (("s", 1, 3, None), ("s", None, None, 2))}, {"spec": (("s", None, -1, None),)})
    attrs = ("spec", "last_only")

    def __init__(self, spec, last_only: bool = False):
        self.spec = tuple(spec)
        # only index arrays can select a position twice
        self.last_only = bool(last_only) and _has_arrays(self.spec)

    def infer(self, x, *idx):
        return (TensorDesc(_probe_shape(self, self.spec, x.shape, idx, (x,) + idx), x.dtype, x.device),)

    def cpu(self, x, *idx):
        # an array, not the NumPy scalar an all-integer (or empty) index gives
        y = np.asarray(x[build_index(self.spec, idx)])
        if self.last_only and y.size:
            keep = _kernels.last_writes(_flat_offsets(np.shape(x), self.spec, idx), int(np.size(x)))
            y = np.where(keep.reshape(y.shape), y, np.zeros((), y.dtype))
        return y

    def vjp(self, inputs, outputs, grads):
        x, idx = inputs[0], inputs[1:]
        if self.last_only:
            # the adjoint of "the elements that stand": an assignment into zeros
            dx = _apply1(SetSubtensor(self.spec), _apply1(ZerosLike(), x), grads[0], *idx)
        else:
            dx = _apply1(SubtensorGrad(self.spec), grads[0], x, *idx)
        return [dx] + [None] * len(idx)

    def cuda_source(self, ctype: str = "float") -> str:
        if not _has_arrays(self.spec):
            return _strided_source("subtensor", ctype, "y = x[index] for a basic index: a strided view of x (src) "
                                   "copied into contiguous y (dst)")
        if self.last_only:
            # offsets as below, -1 where a later element selects the same position
            return Kernel("subtensor_last", "const T* __restrict__ x, const long long* __restrict__ offsets, "
                          "T* __restrict__ y, long long total",
                          "y[idx] = offsets[idx] < 0 ? (T)0 : x[offsets[idx]];", over="total").source(ctype)
        # y = x[index]: offsets[i] is the flat element offset in contiguous x of y's
        # element i, computed by the backend on the host from the index expression
        return Kernel("subtensor", "const T* __restrict__ x, const long long* __restrict__ offsets, "
                      "T* __restrict__ y, long long total", "y[idx] = x[offsets[idx]];", over="total").source(ctype)

    def cuda(self, be, x, *idx):
        self.infer(*_descs(x, *idx))
        if not _has_arrays(self.spec):
            shape, strides, base = _basic_view(x.shape, self.spec)
            y = be.empty(shape, x.dtype)
            _launch_strided(be, self, x, y, shape, strides, base, _c_strides(shape), 0)
            return y
        offsets = _flat_offsets(x.shape, self.spec, idx)
        if self.last_only and offsets.size:
            stand = np.full(offsets.size, -1, np.int64)
            keep = np.flatnonzero(_kernels.last_writes(offsets, int(x.size)))
            stand[keep] = offsets.ravel()[keep]
            offsets = stand.reshape(offsets.shape)
        y = be.empty(offsets.shape, x.dtype)
        if y.size:
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, be.to_device(offsets), y, y.size)
        return y


def _leading_rows(index, shape):
    """For an index that is one integer array on the first axis (the rest
    whole), that array as int64 with negative rows wrapped; else None."""
    if not isinstance(index, tuple):
        index = (index,)
    if (not index or not isinstance(index[0], np.ndarray) or index[0].dtype.kind not in "iu" or not shape
            or any(not (isinstance(i, slice) and i == slice(None)) and i is not Ellipsis for i in index[1:])
            or sum(i is Ellipsis for i in index[1:]) > 1):
        return None
    rows = np.ascontiguousarray(index[0], np.int64)
    if rows.size and rows.min() < 0:
        rows = np.where(rows < 0, rows + shape[0], rows)
    return rows


class SubtensorGrad(Op):
    """Zeros shaped like ``ref`` with ``g`` added at ``index`` (repeated
    indices accumulate): the backward of Subtensor."""
    name = "SubtensorGrad"
    reduce_broadcast = False
    check_params = ({"spec": (("s", 1, 3, None), ("s", None, None, 2))},)
    check_shapes = (((1, 2), (2, 3)), ((0, 2), (0, 3)))
    attrs = ("spec",)
    shape_only_inputs = (1,)

    def __init__(self, spec):
        self.spec = tuple(spec)

    def infer(self, g, ref, *idx):
        _check_assignable(self, g, _probe_shape(self, self.spec, ref.shape, idx, (g, ref) + idx), (g, ref))
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref, *idx):
        out = np.zeros(ref.shape, g.dtype)
        index = build_index(self.spec, idx)
        if _has_arrays(self.spec):
            # np.add.at's additions in its order, in C: by rows for x[rows]
            # (an embedding's backward), else by element offsets
            rows = _leading_rows(index, ref.shape)
            if rows is not None and _kernels.scatter_add_rows(out, rows, np.ascontiguousarray(g)):
                return out
            offsets = _flat_offsets(ref.shape, self.spec, idx)
            if not (offsets.shape == np.shape(g) and _kernels.scatter_add(out, offsets, np.ascontiguousarray(g))):
                np.add.at(out, index, g)
        else:
            out[index] = g
        return out

    def vjp(self, inputs, outputs, grads):
        idx = inputs[2:]
        return [_apply1(Subtensor(self.spec), grads[0], *idx), None] + [None] * len(idx)

    def cuda_source(self, ctype: str = "float") -> str:
        if not _has_arrays(self.spec):
            # basic indexing never selects an element twice: a plain strided store will do
            return _strided_source("subtensor_grad", ctype, "y (ref's shape, zero-filled by the backend first)"
                                   "[index] = g: contiguous g (src, or broadcast: stride 0) stored through the view (dst)")
        # y (contiguous, ref's shape) zero-filled by the backend first; offsets as for
        # Subtensor (one per element of g); repeated offsets accumulate
        return Kernel("subtensor_grad", "const T* __restrict__ g, const long long* __restrict__ offsets, T* y, "
                      "long long total", "atomicAdd(y + offsets[idx], g[idx]);", over="total").source(ctype)

    def cuda(self, be, g, ref, *idx):
        # ref is shape-only (no device memory): only its shape is read
        self.infer(*_descs(g, ref, *idx))
        if not _has_arrays(self.spec):
            shape, strides, base = _basic_view(ref.shape, self.spec)
            y = be.zeros(ref.shape, g.dtype)
            _launch_strided(be, self, g, y, shape, _broadcast_strides(g.shape, shape), 0, strides, base)
            return y
        offsets = _flat_offsets(ref.shape, self.spec, idx)
        y = be.zeros(ref.shape, g.dtype)
        if offsets.size:
            g = be.broadcast_to(g, offsets.shape)
            be.launch_n(be.kernel(self, be.ctype(g.dtype)), g.size, g, be.to_device(offsets), y, g.size)
        return y


def _check_assignable(op, value, shape, descs):
    """``value`` must broadcast to the indexed ``shape`` (as NumPy's assignment demands)."""
    if shape is None or value.shape is None:
        return
    vshape = tuple(value.shape)
    while len(vshape) > len(shape) and vshape[0] == 1:
        vshape = vshape[1:]      # NumPy drops a value's extra leading size-1 axes
    try:
        ok = np.broadcast_shapes(vshape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise op.error(f"cannot assign a value of shape {value.shape} to an index "
                       f"selecting shape {tuple(shape)}", *descs)


class SetSubtensor(Op):
    """A copy of ``x`` with ``value`` (broadcast) written at ``index``.

    Example::

        >>> from gradcore.functional import SetSubtensor, split_index
        >>> spec, arrays = split_index(slice(0, 2))
        >>> y, = gc.core.apply(SetSubtensor(spec), gc.tensor([1.0, 2.0, 3.0]), gc.tensor(0.0))
        >>> y.numpy()
        array([0., 0., 3.], dtype=float32)
    """
    name = "SetSubtensor"
    check_params = ({"spec": (("s", 1, 3, None), ("s", None, None, 2))},)
    check_shapes = (((2, 3), (1, 2)), ((3, 4), (2,)))
    attrs = ("spec",)
    reduce_broadcast = True   # value's gradient comes back in the indexed shape

    def __init__(self, spec):
        self.spec = tuple(spec)

    def infer(self, x, value, *idx):
        shape = _probe_shape(self, self.spec, x.shape, idx, (x, value) + idx)
        _check_assignable(self, value, shape, (x, value))
        return (TensorDesc(x.shape, x.dtype, x.device),)

    def cpu(self, x, value, *idx):
        out = np.array(x)     # a copy, and an array even where a backward hands a 0-d x over as a NumPy scalar
        out[build_index(self.spec, idx)] = value
        return out

    def vjp(self, inputs, outputs, grads):
        g, idx = grads[0], inputs[2:]
        dx = _apply1(SetSubtensor(self.spec), g, 0, *idx)
        # in the value's own shape, whatever the assignment's broadcasting did
        # (summed over broadcast axes; leading size-1 dims NumPy dropped, given back);
        # of a repeated position only the last write reaches the result
        dv = _apply1(SumToLike(), _apply1(Subtensor(self.spec, last_only=True), g, *idx), inputs[1])
        return [dx, dv] + [None] * len(idx)

    def cuda_source(self, ctype: str = "float") -> str:
        if not _has_arrays(self.spec):
            return _strided_source("set_subtensor", ctype, "y (a copy of x, made by the backend first)[index] = "
                                   "value: value (src, broadcast: stride 0) stored through the view (dst)")
        # y holds a copy of x already (the backend copies first); y[offsets[i]] =
        # value[vpos[i]]: vpos is value's flat offset under broadcasting to the indexed
        # shape; the host keeps only the last write of a repeated offset (NumPy's rule)
        return Kernel("set_subtensor", "const T* __restrict__ value, const long long* __restrict__ offsets, "
                      "const long long* __restrict__ vpos, T* __restrict__ y, long long total",
                      "y[offsets[idx]] = value[vpos[idx]];", over="total").source(ctype)

    def cuda(self, be, x, value, *idx):
        self.infer(*_descs(x, value, *idx))
        if not _has_arrays(self.spec):
            shape, strides, base = _basic_view(x.shape, self.spec)
            y = x.copy()
            value = _on_device(be, value, x.dtype)      # NumPy's assignment casts the value
            _launch_strided(be, self, value, y, shape, _broadcast_strides(value.shape, shape), 0, strides, base)
            return y
        host_idx = [_host(a) for a in idx]
        offsets = _flat_offsets(x.shape, self.spec, host_idx)
        # the assignment into a zero-stride probe raises NumPy's own error for a
        # value that does not broadcast to the selection (the shape is only known
        # here when a mask is involved)
        as_strided(np.zeros(1, np.int8), x.shape, (0,) * x.ndim, writeable=True)[
            build_index(self.spec, host_idx)] = as_strided(np.zeros(1, np.int8), value.shape, (0,) * value.ndim)
        vpos = np.broadcast_to(np.arange(value.size, dtype=np.int64).reshape(_assigned_shape(value.shape, offsets.ndim)),
                               offsets.shape).ravel()
        offsets = offsets.ravel()
        # threads write in no order: keep only the last write of a repeated offset
        keep = np.flatnonzero(_kernels.last_writes(offsets, int(x.size)))
        y = x.copy()
        value = _on_device(be, value, x.dtype)
        if keep.size:
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), keep.size, value, be.to_device(offsets[keep]),
                        be.to_device(vpos[keep]), y, keep.size)
        return y


class IndexingOneHot(Op):
    """``out[..., i, ...] = x[..., index[i], ...]`` along ``axis``: one element
    per position (MegEngine's indexing_one_hot).

    Example::

        >>> from gradcore.functional import IndexingOneHot
        >>> x, idx = gc.tensor([[1.0, 2.0], [3.0, 4.0]]), gc.tensor([1, 0])
        >>> y, = gc.core.apply(IndexingOneHot(axis=1), x, idx)
        >>> y.numpy()
        array([2., 3.], dtype=float32)
    """
    name = "IndexingOneHot"
    reduce_broadcast = False
    attrs = ("axis", "keepdims")

    def __init__(self, axis=1, keepdims=False):
        self.axis, self.keepdims = int(axis), bool(keepdims)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op`` (an integer index cannot be generated)."""
        rng = np.random.default_rng(0)
        return [(cls(1), [rng.standard_normal((3, 4)), np.array([0, 3, 1])]),
                (cls(0, True), [rng.standard_normal((3, 2)), np.array([2, 0])])]

    def infer(self, x, index):
        if index.dtype.kind not in "iu":
            raise self.error(f"index must be an integer tensor, got {index.dtype}", x, index)
        if x.shape is None or index.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        ax = self.axis % x.ndim if x.ndim else 0
        expect = x.shape[:ax] + x.shape[ax + 1:]
        if tuple(index.shape) != expect:
            raise self.error(f"index shape must be {expect}", x, index)
        return (TensorDesc(_one_hot_shape(tuple(x.shape), ax, self.keepdims), x.dtype, x.device),)

    def cpu(self, x, index):
        ax = self.axis % x.ndim
        if index.shape != x.shape[:ax] + x.shape[ax + 1:]:   # take_along_axis would broadcast it
            raise ValueError(f"index shape must be {x.shape[:ax] + x.shape[ax + 1:]}")
        # a C loop that checks the range in its pass (None: not its case, or out of range)
        out = _kernels.one_hot_pick(x, index, *_one_hot_view(x.shape, ax))
        if out is not None:
            return out.reshape(_one_hot_shape(x.shape, ax, self.keepdims))
        _check_one_hot_range(index, x.shape, ax)
        out = np.take_along_axis(x, np.expand_dims(index, ax), ax)
        return out if self.keepdims else np.squeeze(out, ax)

    def vjp(self, inputs, outputs, grads):
        x, index = inputs
        return [_apply1(IndexingOneHotGrad(self.axis, self.keepdims), grads[0], x, index), None]

    def cuda_source(self, ctype: str = "float") -> str:
        # x viewed as (outer, n, inner); index and y (keepdims or not) as (outer,
        # inner); an index out of range gives 0 (the host checks bounds)
        return Kernel("indexing_one_hot", "const T* __restrict__ x, const int* __restrict__ index, "
                      "T* __restrict__ y, long long outer, long long n, long long inner", """
            long long k = index[idx];
            if (k < 0) k += n;
            y[idx] = (k >= 0 && k < n) ? x[((idx / inner) * n + k) * inner + idx % inner] : (T)0;""",
                      over="total", setup="const long long total = outer * inner;").source(ctype)

    def cuda(self, be, x, index):
        (out,) = self.infer(*_descs(x, index))
        ax = self.axis % x.ndim
        # the cpu raises for an index out of range (the kernel would give 0): checked
        # on the index's [min, max], read once per content (labels reused each step)
        _check_one_hot_range(be.index_extent(index), x.shape, ax, index.shape)
        outer, n, inner = _outer_n_inner(x.shape, ax)
        y = be.empty(out.shape, x.dtype)
        if y.size:
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, _index32(be, index), y, outer, n, inner)
        return y


def _one_hot_view(shape, ax) -> tuple:
    """(outer, n, inner): ``shape`` seen around its axis ``ax``."""
    return math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])


def _one_hot_shape(shape, ax, keepdims) -> tuple:
    """The picked values' shape: ``shape`` without (or, keepdims, 1 at) ``ax``."""
    return shape[:ax] + ((1,) if keepdims else ()) + shape[ax + 1:]


def _check_one_hot_range(index, x_shape, ax, index_shape=None):
    # ``index`` may be the device index's [min, max] (index_shape then gives its shape)
    # MegEngine's IndexingOneHot takes indices in [0, n) only (gather and
    # scatter, advanced indexing there, also take negative ones from the end)
    n = x_shape[ax]
    if index.size and (index.min() < 0 or index.max() >= n):
        bad = index.min() if index.min() < 0 else index.max()
        raise IndexOpError(f"IndexingOneHot: index {bad} out of range for axis {ax} of size {n} "
                           f"(indexing_one_hot takes indices in [0, {n}); negative ones are not "
                           f"counted from the end) (input shapes: {tuple(x_shape)}, {tuple(index.shape if index_shape is None else index_shape)})")


class IndexingOneHotGrad(Op):
    name = "IndexingOneHotGrad"
    reduce_broadcast = False
    attrs = ("axis", "keepdims")
    shape_only_inputs = (1,)

    def __init__(self, axis, keepdims):
        self.axis, self.keepdims = int(axis), bool(keepdims)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: (g, ref, index)."""
        rng = np.random.default_rng(0)
        return [(cls(1, False), [rng.standard_normal((3,)), rng.standard_normal((3, 4)), np.array([0, 3, 1])])]

    def infer(self, g, ref, index):
        if g.shape is not None and ref.shape is not None and len(ref.shape):
            ax = self.axis % len(ref.shape)
            want = tuple(1 if i == ax else d for i, d in enumerate(ref.shape) if i != ax or self.keepdims)
            if tuple(g.shape) != want:
                raise self.error(f"the gradient must have shape {want}", g, ref, index)
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref, index):
        ax = self.axis % len(ref.shape)
        out = _kernels.one_hot_put(g, index, *_one_hot_view(ref.shape, ax))
        if out is not None:
            return out.reshape(ref.shape)
        out = np.zeros(ref.shape, g.dtype)
        gi = g if self.keepdims else np.expand_dims(g, ax)
        np.put_along_axis(out, np.expand_dims(index, ax), gi, ax)
        return out

    def vjp(self, inputs, outputs, grads):
        return [_apply1(IndexingOneHot(self.axis, self.keepdims), grads[0], inputs[2]), None, None]

    def cuda_source(self, ctype: str = "float") -> str:
        # y (ref's shape) viewed as (outer, n, inner), written whole; g and index as (outer, inner)
        return Kernel("indexing_one_hot_grad", "const T* __restrict__ g, const int* __restrict__ index, "
                      "T* __restrict__ y, long long outer, long long n, long long inner", """
            const long long i = idx % inner; const long long t = idx / inner;
            const long long j = t % n; const long long r = (t / n) * inner + i;
            long long k = index[r];
            if (k < 0) k += n;
            y[idx] = k == j ? g[r] : (T)0;""", over="total", setup="const long long total = outer * n * inner;"
                      ).source(ctype)

    def cuda(self, be, g, ref, index):
        # ref is shape-only. The index is not range-checked again: it is the one
        # the forward (IndexingOneHot, TopK) checked or made, and an index out of
        # range only leaves zeros here
        (out,) = self.infer(*_descs(g, ref, index))
        outer, n, inner = _outer_n_inner(ref.shape, self.axis % len(ref.shape))
        y = be.empty(out.shape, g.dtype)
        if y.size:
            be.launch_n(be.kernel(self, be.ctype(g.dtype)), y.size, g, _index32(be, index), y, outer, n, inner)
        return y


# ---------------------------------------------------------------- gather / scatter
# CUDA kernels below: a grid-stride loop, one thread per output element (per
# row for TopK); index arrays are int32 (``const int*``); arbitrary ranks
# (up to GC_MAX_DIMS) are passed as ``gc_dims`` structs by value; the op's
# attributes that do not depend on the rank are compiled in as constants.
def _strided_source(op_name, ctype, what):
    """A copy between two strided views: one thread per element of ``shape``.
    For each coordinate c of shape: dst[dbase + c . dstr] = src[sbase + c .
    sstr]; element strides (negative for negative steps, 0 where src is
    broadcast), computed on the host."""
    return Kernel(op_name, "const T* __restrict__ src, T* __restrict__ dst, gc_dims shape, gc_dims sstr, "
                  "long long sbase, gc_dims dstr, long long dbase", """
        long long t = idx, s = sbase, o = dbase;
        for (int d = shape.n - 1; d >= 0; --d) {
            const long long c = t % shape.d[d]; t /= shape.d[d];
            s += c * sstr.d[d]; o += c * dstr.d[d];
        }
        dst[o] = src[s];""", over="total", setup=f"""
        // {what}
        long long total = 1;
        for (int d = 0; d < shape.n; ++d) total *= shape.d[d];""").source(ctype, helpers=_DIMS)


def _validate(op, *arrays):
    """Run the op's shape inference on the kernel's arrays: bad input raises
    the op's own error (naming it and the shapes) before any work is done."""
    op.infer(*[TensorDesc(a.shape, a.dtype) for a in arrays])


def _axis_of(op, axis, nd, descs):
    if nd == 0 or not -nd <= axis < nd:
        raise op.error(f"axis {axis} is out of range for {nd} dimensions", *descs)
    return axis % nd


def _check_index_dtype(op, index, descs):
    if any(d.shape is None for d in descs):
        return    # traced (shapes unknown): checked on the real input, so the error shows its shapes
    if index.dtype.kind not in "iu":
        raise op.error(f"index must be an integer tensor, got {index.dtype}", *descs)


def _check_gather_shapes(op, x, index, descs, what="index"):
    """``index`` has x's rank and is no larger than x outside the axis."""
    if index.ndim != x.ndim:
        raise op.error(f"{what} must have as many dimensions as the input ({x.ndim}), "
                       f"got {index.ndim}", *descs)
    ax = _axis_of(op, op.axis, x.ndim, descs)
    for d in range(x.ndim):
        if d != ax and index.shape[d] > x.shape[d]:
            raise op.error(f"{what} size {index.shape[d]} exceeds the input's {x.shape[d]} "
                           f"at dimension {d} (apart from axis {ax})", *descs)
    return ax


def _region(index_shape, ax):
    """x's slice that index covers outside the axis."""
    return tuple(slice(None) if d == ax else slice(0, s) for d, s in enumerate(index_shape))


def _checked_index(op, index, n, ax, arrays):
    if index.size and (index.min() < -n or index.max() >= n):
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise IndexOpError(f"{op._name()}: index out of range for axis {ax} of size {n} "
                           f"(input shapes: {shapes})")
    return np.where(index < 0, index + n, index) if index.size and index.min() < 0 else index


# the element offset of index coordinates in x (the axis coordinate replaced)
_GATHER_BODY = """
long long t = idx, off = 0, stride = 1;
bool ok = true;
for (int d = is.n - 1; d >= 0; --d) {
    long long c = t % is.d[d]; t /= is.d[d];
    if (d == axis) {
        c = index[idx];
        if (c < 0) c += xs.d[d];
        ok = ok && c >= 0 && c < xs.d[d];
    }
    off += c * stride; stride *= xs.d[d];
}
"""

# for one x element: walk the index entries that could point at it (same
# coordinates outside the axis); ``hit`` runs for each one that does
def _scan_body(hit: str) -> str:
    return f"""
long long t = idx, ioff = 0, istride = 1, istride_ax = 1, cax = 0;
bool inside = true;
for (int d = xs.n - 1; d >= 0; --d) {{
    const long long c = t % xs.d[d]; t /= xs.d[d];
    if (d == axis) {{ cax = c; istride_ax = istride; }}
    else {{ inside = inside && c < is.d[d]; ioff += c * istride; }}
    istride *= is.d[d];
}}
if (inside) {{
    for (long long k = 0; k < is.d[axis]; ++k) {{
        const long long p = ioff + k * istride_ax;
        long long v = index[p];
        if (v < 0) v += xs.d[axis];
        if (v == cax) {{ {hit} }}
    }}
}}
"""


_TOTAL_OF_IS = "long long total = 1;\nfor (int d = 0; d < is.n; ++d) total *= is.d[d];"
_TOTAL_OF_XS = "long long total = 1;\nfor (int d = 0; d < xs.n; ++d) total *= xs.d[d];"


class Gather(Op):
    """``out[i][j][k] = x[i][index[i][j][k]][k]`` for axis 1 (torch.gather /
    MegEngine's F.gather): index has x's rank and is no larger than x outside
    ``axis``; the output has index's shape."""
    name = "Gather"
    reduce_broadcast = False
    attrs = ("axis",)

    def __init__(self, axis=0):
        self.axis = int(axis)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op`` (repeated indices included)."""
        rng = np.random.default_rng(0)
        return [(cls(1), [rng.standard_normal((2, 3)), np.array([[0, 2], [1, 1]])]),
                (cls(0), [rng.standard_normal((3, 2)), np.array([[2, 0], [0, 1], [1, 1]])])]

    def infer(self, x, index):
        _check_index_dtype(self, index, (x, index))
        if x.shape is not None and index.shape is not None:
            _check_gather_shapes(self, x, index, (x, index))
        return (TensorDesc(index.shape, x.dtype, x.device),)

    def cpu(self, x, index):
        _validate(self, x, index)
        ax = self.axis % x.ndim
        index = _checked_index(self, index, x.shape[ax], ax, (x, index))
        if x.flags.c_contiguous:
            # one flat take: take_along_axis's broadcast fancy index is 4-6x slower
            return x.reshape(-1).take(_gather_offsets(x.shape, index, ax))
        return np.take_along_axis(x[_region(index.shape, ax)], index, ax)

    def vjp(self, inputs, outputs, grads):
        x, index = inputs
        return [_apply1(GatherGrad(self.axis), grads[0], x, index), None]

    def cuda_source(self, ctype: str = "float") -> str:
        return Kernel("gather", "const T* __restrict__ x, const int* __restrict__ index, T* __restrict__ y, "
                      "gc_dims xs, gc_dims is, int axis", _GATHER_BODY + "y[idx] = ok ? x[off] : (T)0;",
                      over="total", setup=_TOTAL_OF_IS).source(ctype, helpers=_DIMS)

    def cuda(self, be, x, index):
        _validate(self, x, index)
        ax = self.axis % x.ndim
        # the cpu's range error: checked on a host copy of the index (a synchronization)
        _checked_index(self, _host(index), x.shape[ax], ax, (x, index))
        y = be.empty(index.shape, x.dtype)
        if y.size:
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, _index32(be, index), y,
                        be.dims(x.shape), be.dims(index.shape), np.int32(ax))
        return y


def _gather_offsets(shape, index, ax):
    """Flat offsets into a contiguous array of ``shape`` of the elements a
    gather along ``ax`` with ``index`` (in range, non-negative) reads: the
    index along the axis, the position in index's shape elsewhere."""
    strides = _c_strides(shape)
    offsets = index.astype(np.int64) * strides[ax]
    for d, n in enumerate(index.shape):
        if d != ax and n > 1:
            offsets = offsets + (np.arange(n, dtype=np.int64) * strides[d]).reshape(
                (n,) + (1,) * (index.ndim - 1 - d))
    return np.ascontiguousarray(np.broadcast_to(offsets, index.shape))


class GatherGrad(Op):
    """Zeros shaped like ``ref`` with ``g`` added where ``index`` points
    (repeated indices accumulate): Gather's backward (a scatter-add)."""
    name = "GatherGrad"
    reduce_broadcast = False
    attrs = ("axis",)
    shape_only_inputs = (1,)

    def __init__(self, axis=0):
        self.axis = int(axis)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: (g, ref, index)."""
        rng = np.random.default_rng(0)
        return [(cls(1), [rng.standard_normal((2, 2)), rng.standard_normal((2, 3)), np.array([[0, 2], [1, 1]])])]

    def infer(self, g, ref, index):
        _check_index_dtype(self, index, (g, ref, index))
        if g.shape is not None and index.shape is not None and tuple(g.shape) != tuple(index.shape):
            raise self.error("the gradient must have the index's shape", g, ref, index)
        if ref.shape is not None and index.shape is not None:
            _check_gather_shapes(self, ref, index, (g, ref, index))
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref, index):
        ax = self.axis % len(ref.shape)
        index = _checked_index(self, index, ref.shape[ax], ax, (g, ref, index))
        out = np.zeros(ref.shape, g.dtype)
        # np.add.at along one axis (every other coordinate from a broadcast
        # grid), its additions in its order in C
        if not _kernels.scatter_add(out, _gather_offsets(ref.shape, index, ax), np.ascontiguousarray(g)):
            grid = list(np.ogrid[tuple(slice(0, s) for s in index.shape)])
            grid[ax] = index
            np.add.at(out[_region(index.shape, ax)], tuple(grid), g)
        return out

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Gather(self.axis), grads[0], inputs[2]), None, None]

    def cuda_source(self, ctype: str = "float") -> str:
        # one thread per output element, summing every index entry that points at it:
        # deterministic, no atomics
        return Kernel("gather_grad", "const T* __restrict__ g, const int* __restrict__ index, T* __restrict__ y, "
                      "gc_dims xs, gc_dims is, int axis", "T acc = 0;" + _scan_body("acc += g[p];") + "y[idx] = acc;",
                      over="total", setup=_TOTAL_OF_XS).source(ctype, helpers=_DIMS)

    def cuda(self, be, g, ref, index):
        # ref is shape-only. The index is the one Gather checked (or Sort / TopK
        # made): not range-checked again; an entry out of range adds nowhere
        _validate(self, g, ref, index)
        ax = self.axis % len(ref.shape)
        y = be.empty(ref.shape, g.dtype)
        if y.size:
            be.launch_n(be.kernel(self, be.ctype(g.dtype)), y.size, g, _index32(be, index), y,
                        be.dims(ref.shape), be.dims(index.shape), np.int32(ax))
        return y


class Scatter(Op):
    """A copy of ``x`` with ``x[i][index[i][j][k]][k] = source[i][j][k]`` for
    axis 1 (torch.scatter / MegEngine's F.scatter, not accumulating; with
    repeated indices the last write wins). index and source have the same
    shape, x's rank, and are no larger than x outside ``axis``."""
    name = "Scatter"
    reduce_broadcast = False
    attrs = ("axis",)

    def __init__(self, axis=0):
        self.axis = int(axis)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op``: distinct indices per row (a
        repeated index would make the result depend on the write order)."""
        rng = np.random.default_rng(0)
        return [(cls(1), [rng.standard_normal((2, 3)), np.array([[0, 2], [1, 0]]), rng.standard_normal((2, 2))])]

    def infer(self, x, index, source):
        descs = (x, index, source)
        _check_index_dtype(self, index, descs)
        if x.shape is None or index.shape is None or source.shape is None:
            return (TensorDesc(x.shape, x.dtype, x.device),)
        if source.dtype != x.dtype:
            raise self.error(f"source dtype {source.dtype} differs from the input's {x.dtype}", *descs)
        if tuple(index.shape) != tuple(source.shape):
            raise self.error("index and source must have the same shape", *descs)
        _check_gather_shapes(self, x, index, descs)
        return (TensorDesc(x.shape, x.dtype, x.device),)

    def cpu(self, x, index, source):
        _validate(self, x, index, source)
        ax = self.axis % x.ndim
        index = _checked_index(self, index, x.shape[ax], ax, (x, index, source))
        out = x.copy()         # C-contiguous: one flat assignment, the last of a repeated offset standing
        out.reshape(-1)[_gather_offsets(x.shape, index, ax)] = source
        return out

    def vjp(self, inputs, outputs, grads):
        x, index, source = inputs
        g = grads[0]
        dx = _apply1(Scatter(self.axis), g, index, _apply1(ZerosLike(), source))
        return [dx, None, _apply1(Gather(self.axis), g, index)]

    def cuda_source(self, ctype: str = "float") -> str:
        # one thread per output element: the last index entry pointing at it wins
        return Kernel("scatter", "const T* __restrict__ x, const int* __restrict__ index, const T* __restrict__ src, "
                      "T* __restrict__ y, gc_dims xs, gc_dims is, int axis",
                      "T v_out = x[idx];" + _scan_body("v_out = src[p];") + "y[idx] = v_out;",
                      over="total", setup=_TOTAL_OF_XS).source(ctype, helpers=_DIMS)

    def cuda(self, be, x, index, source):
        _validate(self, x, index, source)
        ax = self.axis % x.ndim
        _checked_index(self, _host(index), x.shape[ax], ax, (x, index, source))   # a synchronization
        y = be.empty(x.shape, x.dtype)
        if y.size:
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), y.size, x, _index32(be, index),
                        _on_device(be, source, x.dtype), y,
                        be.dims(x.shape), be.dims(index.shape), np.int32(ax))
        return y


# ---------------------------------------------------------------- sort / topk
def _order(x, descending):
    """Stable argsort along the last axis (ties keep index order)."""
    if descending:
        x = -x if x.dtype.kind == "f" else -(x.astype(np.int64))
    return np.argsort(x, axis=-1, kind="stable")


def _first_k(x, k, descending):
    """``_order(x, descending)[..., :k]`` without sorting whole rows: the k-th
    key by a partition, the keys below it and the first of the keys equal
    to it (index order, as a stable sort has them), then a stable sort of
    those k. None where that does not apply (no shorter than a full sort,
    or a NaN among the k-th keys: NaN's order is the sort's business)."""
    n = x.shape[-1]
    if not 0 < k < n // 4 or x.ndim == 0:
        return None
    keys = (-x if x.dtype.kind == "f" else -(x.astype(np.int64))) if descending else x
    kth = np.partition(keys, k - 1, axis=-1)[..., k - 1:k]
    if kth.dtype.kind == "f" and np.isnan(kth).any():
        return None
    take = keys <= kth
    extra = take.sum(axis=-1, keepdims=True) - k   # keys equal to the k-th beyond the first ones
    if extra.any():
        tie = keys == kth
        # drop the last `extra` ties of each row: keep a tie while fewer than
        # (ties - extra) came before it
        take &= ~tie | (np.cumsum(tie, axis=-1) <= tie.sum(axis=-1, keepdims=True) - extra)
    ind = np.nonzero(take.reshape(-1, n))[1].reshape(x.shape[:-1] + (k,))   # row by row, index order
    return np.take_along_axis(ind, np.argsort(np.take_along_axis(keys, ind, -1), axis=-1, kind="stable"), -1)


# u comes before v (element j before element i): strictly smaller (larger
# when `desc`, a kernel argument), or equal with a smaller index (stable).
# NaN (x != x) goes last either way and NaNs tie, as in NumPy's argsort of x (or -x)
_RANK_CMP = ("((u == u && (v != v || (desc ? u > v : u < v))) || "
             "((u == v || (u != u && v != v)) && j < i))")


class Sort(Op):
    """(sorted values, int32 indices) along the last axis (MegEngine's
    F.sort); stable: equal values keep their order."""
    name = "Sort"
    reduce_broadcast = False
    attrs = ("descending",)

    def __init__(self, descending=False):
        self.descending = bool(descending)

    def infer(self, x):
        if x.shape is not None and x.ndim == 0:
            raise self.error("cannot sort a 0-d tensor (it sorts along the last axis)", x)
        return (TensorDesc(x.shape, x.dtype, x.device), TensorDesc(x.shape, np.int32, x.device))

    def cpu(self, x):
        _validate(self, x)
        order = _order(x, self.descending)
        return np.take_along_axis(x, order, -1), order.astype(np.int32)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(GatherGrad(-1), grads[0], inputs[0], outputs[1])]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_sort_<ctype>(x, y, ind, long long rows, int n, int desc)``:
        x as (rows, n); one thread per element (grid-stride loop,
        ``launch_n(rows*n)``): its rank in its row is where it goes."""
        return Kernel("sort", "const T* __restrict__ x, T* __restrict__ y, int* __restrict__ ind, long long rows, "
                      "int n, int desc", f"""
            const int i = (int)(idx % n);
            const T* row = x + (idx - i);
            const T v = row[i];
            int rank = 0;
            for (int j = 0; j < n; ++j) {{
                const T u = row[j];
                if {_RANK_CMP} ++rank;
            }}
            y[idx - i + rank] = v;
            ind[idx - i + rank] = i;""", over="total", setup="const long long total = rows * n;").source(ctype)

    def cuda(self, be, x):
        _validate(self, x)
        y, ind = be.empty(x.shape, x.dtype), be.empty(x.shape, np.int32)
        if x.size:
            n = x.shape[-1]
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), x.size, x, y, ind, x.size // n, np.int32(n),
                        np.int32(self.descending))
        return y, ind


TOPK_MODES = ("sorted", "no_sort", "kth_only")


class TopK(Op):
    """The ``k`` smallest (largest when ``descending``) elements along the
    last axis and their int32 indices (MegEngine's F.topk). ``mode``:
    "sorted" (in order), "no_sort" (in index order), "kth_only" (only the
    k-th one: the last axis is removed)."""
    name = "TopK"
    reduce_broadcast = False
    check_params = ({"k": 2}, {"k": 1, "descending": True})
    attrs = ("k", "descending", "mode")

    def __init__(self, k, descending=False, mode="sorted"):
        if mode not in TOPK_MODES:
            raise ValueError(f"TopK: mode must be one of {TOPK_MODES}, got {mode!r}")
        self.k, self.descending, self.mode = int(k), bool(descending), mode

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device), TensorDesc(None, np.int32, x.device))
        if x.ndim == 0:
            raise self.error("needs at least one dimension (it selects along the last axis)", x)
        n, low = x.shape[-1], 1 if self.mode == "kth_only" else 0
        if not low <= self.k <= n:
            raise self.error(f"k={self.k} is out of range [{low}, {n}] for a last axis of size {n}", x)
        shape = x.shape[:-1] if self.mode == "kth_only" else x.shape[:-1] + (self.k,)
        return (TensorDesc(shape, x.dtype, x.device), TensorDesc(shape, np.int32, x.device))

    def cpu(self, x):
        _validate(self, x)
        ind = _first_k(x, self.k, self.descending)
        if ind is None:
            ind = _order(x, self.descending)[..., :self.k]
        if self.mode == "kth_only":
            ind = ind[..., self.k - 1]
            return np.take_along_axis(x, ind[..., None], -1)[..., 0], ind.astype(np.int32)
        if self.mode == "no_sort":
            ind = np.sort(ind, axis=-1)
        return np.take_along_axis(x, ind, -1), ind.astype(np.int32)

    def vjp(self, inputs, outputs, grads):
        if self.mode == "kth_only":
            return [_apply1(IndexingOneHotGrad(-1, False), grads[0], inputs[0], outputs[1])]
        return [_apply1(GatherGrad(-1), grads[0], inputs[0], outputs[1])]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_topk_<ctype>(x, y, ind, long long rows, int n, int k, int mode,
        int desc)``: x as (rows, n), ``mode`` the index of the op's mode in
        ``TOPK_MODES``; y and ind (rows, k), or (rows,) for "kth_only". One
        thread per row (grid-stride loop, ``launch_n(rows)``): each
        element's rank, O(n^2), in index order."""
        return Kernel("topk", "const T* __restrict__ x, T* __restrict__ y, int* __restrict__ ind, long long rows, "
                      "int n, int k, int mode, int desc", f"""
            const T* row = x + r * n;
            T* yr = y + r * (kth_only ? 1 : k);
            int* ir = ind + r * (kth_only ? 1 : k);
            int pos = 0;   // no_sort: the next slot, in index order
            for (int i = 0; i < n; ++i) {{
                const T v = row[i];
                int rank = 0;
                for (int j = 0; j < n; ++j) {{
                    const T u = row[j];
                    if {_RANK_CMP} ++rank;
                }}
                if (kth_only) {{
                    if (rank == k - 1) {{ yr[0] = v; ir[0] = i; }}
                }} else if (rank < k) {{
                    const int at = no_sort ? pos++ : rank;
                    yr[at] = v; ir[at] = i;
                }}
            }}""", over="rows", index="r", setup=f"const bool kth_only = mode == {TOPK_MODES.index('kth_only')}, "
                      f"no_sort = mode == {TOPK_MODES.index('no_sort')};").source(ctype)

    def cuda(self, be, x):
        (vd, idd) = self.infer(*_descs(x))
        y, ind = be.empty(vd.shape, x.dtype), be.empty(idd.shape, np.int32)
        if y.size:
            n = x.shape[-1]
            rows = x.size // n
            be.launch_n(be.kernel(self, be.ctype(x.dtype)), rows, x, y, ind, rows, np.int32(n),
                        np.int32(self.k), np.int32(TOPK_MODES.index(self.mode)), np.int32(self.descending))
        return y, ind
