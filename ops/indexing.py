"""Indexing: NumPy-style basic and advanced indexing, index assignment,
and indexing_one_hot (picking one element per row, as in cross-entropy).

An index is stored as a hashable "spec" (ints, slices, None, Ellipsis, and
``("t", k)`` placeholders); the index arrays themselves are extra inputs of
the op, so an op instance is shared by every call with the same index form.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from gradcore import _core
from gradcore.op import Op, OpError, TensorDesc


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


class IndexOpError(OpError, IndexError):
    """An index out of range: an IndexError, as in NumPy, and an OpError."""


def split_index(index) -> Tuple[tuple, list]:
    """(spec, index arrays) for a Python index expression."""
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
        else:
            spec.append(("t", len(arrays)))
            arrays.append(item)
    return tuple(spec), arrays


def _int_or_none(v):
    return None if v is None else int(v)


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
    arrays = [np.zeros(d.shape, d.dtype) if d.dtype.kind == "b" else np.zeros(d.shape, d.dtype)
              for d in idx_descs]
    if any(d.dtype.kind not in "biu" for d in idx_descs):
        raise op.error("index arrays must be integer or boolean", *descs)
    if any(d.dtype.kind == "b" for d in idx_descs):
        return None   # the result size depends on the mask's values
    try:
        return probe[build_index(spec, arrays)].shape
    except IndexError as exc:
        raise IndexOpError(str(op.error(str(exc), *descs))) from None


class Subtensor(Op):
    """``x[index]``; index arrays are extra inputs."""
    name = "Subtensor"
    attrs = ("spec",)

    def __init__(self, spec):
        self.spec = tuple(spec)
        self._seal()

    def infer(self, x, *idx):
        return (TensorDesc(_probe_shape(self, self.spec, x.shape, idx, (x,) + idx), x.dtype, x.device),)

    def cpu(self, x, *idx):
        return x[build_index(self.spec, idx)]

    def vjp(self, inputs, outputs, grads):
        x, idx = inputs[0], inputs[1:]
        return [_apply1(SubtensorGrad(self.spec), grads[0], x, *idx)] + [None] * len(idx)


class SubtensorGrad(Op):
    """Zeros shaped like ``ref`` with ``g`` added at ``index`` (repeated
    indices accumulate): the backward of Subtensor."""
    name = "SubtensorGrad"
    attrs = ("spec",)
    shape_only_inputs = (1,)

    def __init__(self, spec):
        self.spec = tuple(spec)
        self._seal()

    def infer(self, g, ref, *idx):
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref, *idx):
        out = np.zeros(ref.shape, g.dtype)
        index = build_index(self.spec, idx)
        if _has_arrays(self.spec):
            np.add.at(out, index, g)
        else:
            out[index] = g
        return out

    def vjp(self, inputs, outputs, grads):
        idx = inputs[2:]
        return [_apply1(Subtensor(self.spec), grads[0], *idx), None] + [None] * len(idx)


class SetSubtensor(Op):
    """A copy of ``x`` with ``value`` (broadcast) written at ``index``."""
    name = "SetSubtensor"
    attrs = ("spec",)
    reduce_broadcast = True   # value's gradient comes back in the indexed shape

    def __init__(self, spec):
        self.spec = tuple(spec)
        self._seal()

    def infer(self, x, value, *idx):
        shape = _probe_shape(self, self.spec, x.shape, idx, (x, value) + idx)
        if shape is not None and value.shape is not None:
            try:
                np.broadcast_shapes(value.shape, shape)
            except ValueError:
                raise self.error(f"cannot assign a value of shape {value.shape} to an index "
                                 f"selecting shape {shape}", x, value) from None
        return (TensorDesc(x.shape, x.dtype, x.device),)

    def cpu(self, x, value, *idx):
        out = x.copy()
        out[build_index(self.spec, idx)] = value
        return out

    def vjp(self, inputs, outputs, grads):
        g, idx = grads[0], inputs[2:]
        dx = _apply1(SetSubtensor(self.spec), g, 0, *idx)
        dv = _apply1(Subtensor(self.spec), g, *idx)
        return [dx, dv] + [None] * len(idx)


class IndexingOneHot(Op):
    """``out[..., i, ...] = x[..., index[i], ...]`` along ``axis``: one element
    per position (MegEngine's indexing_one_hot)."""
    name = "IndexingOneHot"
    attrs = ("axis", "keepdims")

    def __init__(self, axis=1, keepdims=False):
        self.axis, self.keepdims = int(axis), bool(keepdims)
        self._seal()

    def infer(self, x, index):
        if index.dtype.kind not in "iu":
            raise self.error(f"index must be an integer tensor, got {index.dtype}", x, index)
        if x.shape is None or index.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        ax = self.axis % x.ndim if x.ndim else 0
        expect = x.shape[:ax] + x.shape[ax + 1:]
        if tuple(index.shape) != expect:
            raise self.error(f"index shape must be {expect}", x, index)
        shape = x.shape[:ax] + ((1,) if self.keepdims else ()) + x.shape[ax + 1:]
        return (TensorDesc(shape, x.dtype, x.device),)

    def cpu(self, x, index):
        ax = self.axis % x.ndim
        if index.size and (index.min() < -x.shape[ax] or index.max() >= x.shape[ax]):
            raise IndexError(f"index out of range for axis {ax} of size {x.shape[ax]}")
        out = np.take_along_axis(x, np.expand_dims(index, ax), ax)
        return out if self.keepdims else np.squeeze(out, ax)

    def vjp(self, inputs, outputs, grads):
        x, index = inputs
        return [_apply1(IndexingOneHotGrad(self.axis, self.keepdims), grads[0], x, index), None]


class IndexingOneHotGrad(Op):
    name = "IndexingOneHotGrad"
    attrs = ("axis", "keepdims")
    shape_only_inputs = (1,)

    def __init__(self, axis, keepdims):
        self.axis, self.keepdims = int(axis), bool(keepdims)
        self._seal()

    def infer(self, g, ref, index):
        return (TensorDesc(ref.shape, g.dtype, g.device),)

    def cpu(self, g, ref, index):
        ax = self.axis % len(ref.shape)
        out = np.zeros(ref.shape, g.dtype)
        gi = g if self.keepdims else np.expand_dims(g, ax)
        np.put_along_axis(out, np.expand_dims(index, ax), gi, ax)
        return out

    def vjp(self, inputs, outputs, grads):
        return [_apply1(IndexingOneHot(self.axis, self.keepdims), grads[0], inputs[2]), None, None]
