"""Shape ops: reshape, transpose, broadcast, expand_dims, squeeze, cast, and
the "like" helpers backward graphs use (their reference input is read only
for its shape, so backward graphs keep a shape carrier instead of it)."""
from __future__ import annotations

import functools
import math
import operator
from typing import Optional, Sequence

import numpy as np

from gradcore import _core, dtypes
from gradcore.cuda.kernels import Kernel, source
from gradcore.op import Op, OpError, TensorDesc


def _apply1(op, *args):
    return _core.apply(op, *args)[0]


def _norm_axes(axes, ndim, op, desc):
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise op.error(f"axis {a} is out of range for {ndim} dimensions", desc)
        out.append(a % ndim)
    return tuple(out)


def _int_shape(op_name, shape):
    try:
        # ints, NumPy ints, 0-d integer tensors; never a float, even a whole one
        return tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"{op_name}: shape entries must be integers, got {tuple(shape)!r}") from None


def _axis_tuple(axis):
    return tuple(int(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))


def _resolve_shape(op, shape, in_shape, desc):
    shape = tuple(int(s) for s in shape)
    if in_shape is None:      # traced: checked when the shape is known
        return None if -1 in shape else shape
    if shape.count(-1) > 1:
        raise op.error(f"at most one dimension of {shape} can be -1", desc)
    size = int(math.prod(in_shape))
    if -1 in shape:
        rest = int(math.prod([s for s in shape if s != -1]))
        if rest == 0 or size % rest:
            raise op.error(f"cannot reshape {size} elements into {shape}", desc)
        shape = tuple(size // rest if s == -1 else s for s in shape)
    if int(math.prod(shape)) != size:
        raise op.error(f"cannot reshape {size} elements into {shape}", desc)
    return shape


class Reshape(Op):
    """``x`` with its elements in ``shape`` (one entry may be -1).

    Example::

        >>> from gradcore.functional import Reshape
        >>> y, = gc.core.apply(Reshape((2, -1)), gc.tensor([1.0, 2.0, 3.0, 4.0]))
        >>> y.numpy()
        array([[1., 2.],
               [3., 4.]], dtype=float32)
    """

    name = "Reshape"
    reduce_broadcast = False
    check_params = ({"shape": (3, 2)}, {"shape": (-1,)})
    attrs = ("shape",)

    def __init__(self, shape: Sequence[int]):
        self.shape = _int_shape("Reshape", shape)
        # NumPy's reshape takes any negative dim as -1; MegEngine and torch
        # reject all but -1. Checked here since the cpu kernel is NumPy's
        bad = [s for s in self.shape if s < -1]
        if bad:
            raise OpError(f"Reshape(shape={self.shape}): dimension {bad[0]} is negative "
                          "(only -1, for one inferred dimension, may be)")

    def infer(self, x):
        return (TensorDesc(_resolve_shape(self, self.shape, x.shape, x), x.dtype, x.device),)

    def cpu(self, x):
        return x.reshape(self.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("reshape", ctype, "reshape (cuda: a view, no kernel)")

    def cuda(self, be, x):
        return _view(self, x)


def _check_broadcastable(op, src, dst, descs, what):
    """Raise the op's error unless shape ``src`` broadcasts to ``dst`` (both known)."""
    if src is None or dst is None:
        return
    if len(src) > len(dst) or any(a != 1 and a != b for a, b in zip(src[::-1], dst[::-1])):
        raise op.error(what, *descs)


def _drop_leading_ones(op, shape, ndim, descs, what):
    """``shape`` without the size-1 dims it has in front beyond ``ndim`` (the
    value of an index assignment NumPy broadcast by dropping them; its
    gradient is summed to, and broadcast back from, the shape with them)."""
    if shape is None or ndim is None or len(shape) <= ndim:
        return shape
    extra = len(shape) - ndim
    if any(n != 1 for n in shape[:extra]):
        raise op.error(what, *descs)
    return tuple(shape[extra:])


class ReshapeLike(Op):
    """reshape(x, shape of ref)."""
    name = "ReshapeLike"
    reduce_broadcast = False
    shape_only_inputs = (1,)

    def infer(self, x, ref):
        if x.shape is not None and ref.shape is not None and int(np.prod(x.shape)) != int(np.prod(ref.shape)):
            raise self.error("cannot reshape: the sizes differ", x, ref)
        return (TensorDesc(ref.shape, x.dtype, x.device),)

    def cpu(self, x, ref):
        return x.reshape(ref.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0]), None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("reshape_like", ctype, "reshape to ref's shape (ref is not passed; cuda: a view)")

    def cuda(self, be, x, ref):
        return _view(self, x, ref)


class Transpose(Op):
    """``x`` with its axes permuted by ``perm``.

    Example::

        >>> from gradcore.functional import Transpose
        >>> y, = gc.core.apply(Transpose((1, 0)), gc.tensor([[1.0, 2.0, 3.0]]))
        >>> y.numpy()
        array([[1.],
               [2.],
               [3.]], dtype=float32)
    """

    name = "Transpose"
    reduce_broadcast = False
    check_params = ({"perm": (1, 0)}, {"perm": (2, 0, 1)})
    attrs = ("perm",)

    def __init__(self, perm: Sequence[int]):
        # negative axes count from the end, as in NumPy: a valid perm has one
        # entry per axis, so len(perm) is the rank. Normalised here so the
        # backward's inverse permutation (argsort) is right
        n = len(perm)
        self.perm = tuple(int(p) % n if -n <= int(p) < 0 else int(p) for p in perm)

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        if sorted(self.perm) != list(range(x.ndim)):
            raise self.error(f"perm {self.perm} is not a permutation of {x.ndim} axes", x)
        return (TensorDesc(tuple(x.shape[p] for p in self.perm), x.dtype, x.device),)

    def cpu(self, x):
        return x.transpose(self.perm)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Transpose(tuple(np.argsort(self.perm))), grads[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_transpose_<ctype>(x, y, xs, perm)``: y = x.transpose(perm), x
        contiguous of shape ``xs``, y contiguous; ``perm`` is a ``gc_dims``
        (one kernel for every permutation). One thread per y element,
        grid-stride loop. And ``gc_transpose_tiled_<ctype>(x, y, batch, rows,
        cols)``: x (batch, rows, cols) to y (batch, cols, rows) through 32 x 32
        tiles in shared memory, so that reads and writes are both coalesced
        (the swap of the last two axes, after merging)."""
        return source(ctype, _TRANSPOSE, _TRANSPOSE_TILED, helpers=_DIMS)

    @staticmethod
    @functools.lru_cache(maxsize=None)      # built once per type: launchers ask on every call
    def plain_source(ctype: str) -> str:
        """The source of ``gc_transpose_<ctype>`` alone (its own module: the host
        emulator runs it in one pass, without fibers)."""
        return _TRANSPOSE.source(ctype, helpers=_DIMS)

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def tiled_source(ctype: str) -> str:
        """The source of ``gc_transpose_tiled_<ctype>`` alone."""
        return _TRANSPOSE_TILED.source(ctype)

    def cuda(self, be, x):
        (out,) = self.infer_arrays(x)
        shape, perm = _merge_axes(x.shape, self.perm)
        if perm == tuple(range(len(perm))):     # the order of the elements is unchanged
            return x.reshape(out.shape)
        y = be.empty(out.shape, x.dtype)
        ctype = be.ctype(x.dtype)
        if perm in ((1, 0), (0, 2, 1)) and y.size:      # a batch of matrices transposed: tiles
            batch, rows, cols = (1,) * (3 - len(shape)) + shape
            tiles = batch * -(-rows // 32) * -(-cols // 32)
            be.launch(be.kernel(self, ctype, source=self.tiled_source(ctype)), (min(tiles, 1 << 16),), (32, 8),
                      x, y, batch, rows, cols)
            return y
        be.launch_n(be.kernel(self, ctype, source=self.plain_source(ctype)), y.size, x, y, be.dims(shape),
                    be.dims(perm))
        return y


class Broadcast(Op):
    """``x`` broadcast to ``shape`` (NumPy's rules); the gradient is summed back.

    Example::

        >>> from gradcore.functional import Broadcast
        >>> y, = gc.core.apply(Broadcast((2, 3)), gc.tensor([1.0, 2.0, 3.0]))
        >>> y.numpy()
        array([[1., 2., 3.],
               [1., 2., 3.]], dtype=float32)
    """

    name = "Broadcast"
    check_params = ({"shape": (2, 3)}, {"shape": (2, 4, 3)})
    # inputs both shapes accept: the generated ones reached (2, 3) only
    check_shapes = (((3,),), ((1, 3),), ((2, 1),))
    attrs = ("shape",)
    reduce_broadcast = True   # the gradient is the output grad, summed down centrally

    def __init__(self, shape: Sequence[int]):
        self.shape = _int_shape("Broadcast", shape)

    def infer(self, x):
        if x.shape is not None:
            try:
                if tuple(np.broadcast_shapes(x.shape, self.shape)) != self.shape:
                    raise ValueError
            except ValueError:
                raise self.error(f"cannot broadcast to {self.shape}", x) from None
        return (TensorDesc(self.shape, x.dtype, x.device),)

    def cpu(self, x):
        return np.broadcast_to(x, self.shape)

    def vjp(self, inputs, outputs, grads):
        return [grads[0]]

    def cuda_source(self, ctype: str = "float") -> str:
        return _broadcast_source("broadcast", ctype, "the op's shape")

    def cuda(self, be, x):
        return _broadcast(be, self, x, self.shape)


class BroadcastToLike(Op):
    """broadcast x to the shape of ref."""
    name = "BroadcastToLike"
    shape_only_inputs = (1,)
    reduce_broadcast = True

    def infer(self, x, ref):
        what = "x does not broadcast to ref's shape"
        src = _drop_leading_ones(self, x.shape, None if ref.shape is None else len(ref.shape), (x, ref), what)
        _check_broadcastable(self, src, ref.shape, (x, ref), what)
        return (TensorDesc(ref.shape, x.dtype, x.device),)

    def cpu(self, x, ref):
        return np.broadcast_to(_without_leading_ones(x, len(ref.shape)), ref.shape)

    def vjp(self, inputs, outputs, grads):
        # summed to x's own shape, extra leading ones included (dropped in the
        # forward): the core's reduction to an input's shape never adds dims
        return [_apply1(SumToLike(), grads[0], inputs[0]), None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _broadcast_source("broadcast_to_like", ctype, "ref's shape")

    def cuda(self, be, x, ref):
        # ref may be shape-only: its shape is all we read
        return _broadcast(be, self, _without_leading_ones(x, len(ref.shape)), ref.shape)


def _without_leading_ones(x, ndim):
    """x (an array of either device) reshaped without its extra leading dims
    (size 1, checked by infer) beyond ``ndim``: SumToLike's gradient."""
    return x.reshape(x.shape[x.ndim - ndim:]) if x.ndim > ndim else x


class SumToLike(Op):
    """Sum x down to the (broadcast-compatible) shape of ref."""
    name = "SumToLike"
    reduce_broadcast = False
    shape_only_inputs = (1,)

    def infer(self, x, ref):
        what = "ref's shape does not broadcast to x's"
        target = _drop_leading_ones(self, ref.shape, None if x.shape is None else len(x.shape), (x, ref), what)
        _check_broadcastable(self, target, x.shape, (x, ref), what)
        return (TensorDesc(ref.shape, x.dtype, x.device),)

    def cpu(self, x, ref):
        return sum_to(x, ref.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(BroadcastToLike(), grads[0], inputs[0]), None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _sum_to_source("sum_to_like", ctype, "ref's shape")

    def cuda(self, be, x, ref):
        return _sum_to(be, self, x, ref.shape)         # ref may be shape-only: its shape is all we read


class SumTo(Op):
    """Sum x down to a fixed shape (the core's central broadcast reduction
    when a backward is itself recorded)."""
    name = "SumTo"
    reduce_broadcast = False
    check_params = ({"shape": (1, 3)}, {"shape": (3,)})
    attrs = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(int(s) for s in shape)

    def infer(self, x):
        _check_broadcastable(self, self.shape, x.shape, (x,), f"the shape {self.shape} does not broadcast to x's")
        return (TensorDesc(self.shape, x.dtype, x.device),)

    def cpu(self, x):
        return sum_to(x, self.shape)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(BroadcastToLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _sum_to_source("sum_to", ctype, "the op's shape")

    def cuda(self, be, x):
        return _sum_to(be, self, x, self.shape)


def _extra_leading_ones(x_shape, shape) -> int:
    """How many more dims ``shape`` has than ``x_shape``, all of size 1 in
    front (a value NumPy's index assignment broadcast by dropping them): its
    gradient is summed to the rest of the shape, then given them back."""
    extra = len(shape) - len(x_shape)
    if extra > 0 and any(s != 1 for s in shape[:extra]):
        raise ValueError(f"cannot sum a gradient of shape {tuple(x_shape)} to shape {tuple(shape)}")
    return max(extra, 0)


def sum_to(x, shape):
    shape = tuple(shape)
    if x.shape == shape:
        return x
    extra = _extra_leading_ones(x.shape, shape)
    if extra:
        return sum_to(x, shape[extra:]).reshape(shape)
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and x.shape[i + lead] != 1)
    return np.asarray(x.sum(axis=axes)).reshape(shape)


class ZerosLike(Op):
    name = "ZerosLike"
    reduce_broadcast = False
    shape_only_inputs = (0,)

    def infer(self, ref):
        return (TensorDesc(ref.shape, ref.dtype, ref.device),)

    def cpu(self, ref):
        return np.zeros(ref.shape, ref.dtype)

    def vjp(self, inputs, outputs, grads):
        return [None]

    def cuda_source(self, ctype: str = "float") -> str:
        # y: total contiguous elements (ref is not passed)
        return Kernel("zeros_like", "T* __restrict__ y, long long total", "y[idx] = (T)0;", over="total").source(ctype)

    def cuda(self, be, ref):
        return be.zeros(ref.shape, ref.dtype)      # a memset; ref may be shape-only


class ExpandDims(Op):
    """``x`` with new size-1 axes at ``axis`` (an int or a tuple).

    Example::

        >>> from gradcore.functional import ExpandDims
        >>> y, = gc.core.apply(ExpandDims(axis=1), gc.tensor([1.0, 2.0]))
        >>> y.shape
        (2, 1)
    """

    name = "ExpandDims"
    reduce_broadcast = False
    check_params = ({"axis": 0}, {"axis": -1})
    attrs = ("axis",)

    def __init__(self, axis):
        self.axis = _axis_tuple(axis)

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        nd = x.ndim + len(self.axis)
        axes = _norm_axes(self.axis, nd, self, x)
        if len(set(axes)) != len(axes):
            # (the output would have fewer axes than the count says)
            raise self.error(f"axis {self.axis} names an axis twice", x)
        it = iter(x.shape)
        return (TensorDesc(tuple(1 if i in axes else next(it) for i in range(nd)), x.dtype, x.device),)

    def cpu(self, x):
        return np.expand_dims(x, self.axis)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("expand_dims", ctype, "expand_dims (cuda: a view, no kernel)")

    def cuda(self, be, x):
        return _view(self, x)


class Squeeze(Op):
    """``x`` without the size-1 axes in ``axis`` (every one when None).

    Example::

        >>> from gradcore.functional import Squeeze
        >>> y, = gc.core.apply(Squeeze(axis=0), gc.tensor([[1.0, 2.0]]))
        >>> y.numpy()
        array([1., 2.], dtype=float32)
    """

    name = "Squeeze"
    reduce_broadcast = False
    attrs = ("axis",)
    # every 1 (the default), and one given axis (the generated (1, 2, 5, 5) input has it)
    check_params = ({}, {"axis": 0})

    def __init__(self, axis=None):
        self.axis = None if axis is None else _axis_tuple(axis)

    def infer(self, x):
        if x.shape is None:
            return (TensorDesc(None, x.dtype, x.device),)
        if self.axis is None:
            return (TensorDesc(tuple(s for s in x.shape if s != 1), x.dtype, x.device),)
        axes = _norm_axes(self.axis, x.ndim, self, x)
        for a in axes:
            if x.shape[a] != 1:
                raise self.error(f"cannot squeeze axis {a} of size {x.shape[a]}", x)
        return (TensorDesc(tuple(s for i, s in enumerate(x.shape) if i not in axes), x.dtype, x.device),)

    def cpu(self, x):
        return np.squeeze(x, self.axis)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(ReshapeLike(), grads[0], inputs[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("squeeze", ctype, "squeeze (cuda: a view, no kernel)")

    def cuda(self, be, x):
        return _view(self, x)


class Cast(Op):
    """``x`` converted to ``dtype``; the gradient is cast back to the input's
    dtype (none unless both dtypes are floating).

    Example::

        >>> from gradcore.functional import Cast
        >>> y, = gc.core.apply(Cast("int32"), gc.tensor([1.5, -2.5]))
        >>> y.numpy()
        array([ 1, -2], dtype=int32)
    """

    name = "Cast"
    reduce_broadcast = False
    # float64 only: a float32 output cannot be checked against float64 finite differences
    check_params = ({"dtype": "float64"},)
    attrs = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtypes.check_dtype(dtype, "astype")

    def infer(self, x):
        return (TensorDesc(x.shape, self.dtype, x.device),)

    def cpu(self, x):
        return x.astype(self.dtype)

    def vjp(self, inputs, outputs, grads):
        x = inputs[0]
        if x.dtype.kind not in "fc" or self.dtype.kind not in "fc":
            return [None]
        return [_apply1(Cast(x.dtype), grads[0])]

    def cuda(self, be, x):
        y = be.empty(x.shape, self.dtype)
        src = self.cuda_source(be.ctype(x.dtype), be.ctype(self.dtype))
        be.launch_n(be.kernel(self, be.ctype(x.dtype), source=src), y.size, x, y, y.size)
        return y

    def cuda_source(self, ctype: str = "float", to_ctype: Optional[str] = None) -> str:
        """Convert ``ctype`` elements to ``to_ctype`` (default: the C type of
        the op's dtype); the kernel is ``gc_cast_<ctype>_to_<to_ctype>``."""
        if to_ctype is None:
            if self.dtype.name not in CUDA_CTYPES:
                raise ValueError(f"Cast: no CUDA C type for {self.dtype}")
            to_ctype = CUDA_CTYPES[self.dtype.name]
        return Kernel("cast", "const T* __restrict__ x, U* __restrict__ y, long long total",
                      "y[idx] = (U)x[idx];", over="total").source(ctype, U=to_ctype)


def cast_to(x, dtype):
    """``x`` as ``dtype`` through a recorded Cast (its gradient comes back in
    x's own dtype); the cast gradcore's dtype rules insert before an op."""
    return _apply1(Cast(np.dtype(dtype)), x)


class Copy(Op):
    """``x`` copied to ``device`` ("cpu" or "cuda"): ``Tensor.to(device)``.
    Differentiable: the gradient is copied back to the input's device."""
    name = "Copy"
    reduce_broadcast = False
    attrs = ("device",)
    # checked as the copy to the cpu: check_op's cases run on one device, and
    # the copies between devices are tests/cuda's (test_round_trips.py)
    check_params = ({"device": "cpu"},)

    def __init__(self, device: str = "cpu"):
        from gradcore.devices import norm_device
        self.device = norm_device(device)

    def infer(self, x):
        return (TensorDesc(x.shape, x.dtype, self.device),)

    def cpu(self, x):
        # runs wherever the input is (backward graphs call it on either device)
        from gradcore import devices
        if self.device == "cpu":
            return np.array(devices.to_host(x))
        if isinstance(x, np.ndarray):
            return devices.to_device(x, self.device)
        return x.copy()

    def cuda(self, be, x):
        return self.cpu(x)

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Copy(inputs[0].device), grads[0])]

    def cuda_source(self, ctype: str = "float") -> str:
        """``gc_copy_<ctype>(x, y, total)``: a device-to-device copy of
        contiguous arrays (host <-> device copies are driver memcpys)."""
        return _copy_source("copy", ctype, "a device-to-device copy")


# the core wraps a Copy's output on its target device (a logical one, "cpu1", too)
_core._install_hooks(copy_op=Copy)


class Identity(Op):
    """``x`` itself: the gradient passes unchanged.

    Example::

        >>> from gradcore.functional import Identity
        >>> y, = gc.core.apply(Identity(), gc.tensor([1.0, 2.0]))
        >>> y.numpy()
        array([1., 2.], dtype=float32)
    """

    name = "Identity"
    reduce_broadcast = False

    def infer(self, x):
        return (x,)

    def cpu(self, x):
        return x

    def vjp(self, inputs, outputs, grads):
        return [grads[0]]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("identity", ctype, "identity (cuda: the input itself, as on the cpu)")

    def cuda(self, be, x):
        return x


class StopGradient(Identity):
    """Identity in the forward, no gradient in the backward.

    Example::

        >>> from gradcore.functional import StopGradient
        >>> y, = gc.core.apply(StopGradient(), gc.tensor([1.0, 2.0]))
        >>> y.numpy()
        array([1., 2.], dtype=float32)
    """
    name = "StopGradient"
    reduce_broadcast = False
    check_gradient = "zero"      # by design: check_op checks that it is exactly zero

    def vjp(self, inputs, outputs, grads):
        return [None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _copy_source("stop_gradient", ctype, "stop_gradient (identity forward; cuda: the input itself)")


class Concat(Op):
    """The inputs joined along ``axis``.

    Example::

        >>> from gradcore.functional import Concat
        >>> y, = gc.core.apply(Concat(axis=1), gc.tensor([[1.0], [2.0]]), gc.tensor([[3.0], [4.0]]))
        >>> y.numpy()
        array([[1., 3.],
               [2., 4.]], dtype=float32)
    """

    name = "Concat"
    reduce_broadcast = False
    attrs = ("axis",)

    def __init__(self, axis=0):
        self.axis = int(axis)

    input_dtypes = dtypes.promoted_inputs      # MegEngine's: one dtype for all inputs

    def infer(self, *xs):
        if not xs:
            raise self.error("needs at least one input")
        dtype = dtypes.promote_types(*[x.dtype for x in xs])
        if any(x.shape is None for x in xs):
            return (TensorDesc(None, dtype, xs[0].device),)
        nd = xs[0].ndim
        if any(x.ndim != nd for x in xs) or not -nd <= self.axis < nd:
            raise self.error("inputs must have the same number of dimensions and a valid axis", *xs)
        ax = self.axis % nd
        for x in xs:
            if any(x.shape[i] != xs[0].shape[i] for i in range(nd) if i != ax):
                raise self.error(f"shapes differ outside axis {ax}", *xs)
        shape = list(xs[0].shape)
        shape[ax] = sum(x.shape[ax] for x in xs)
        return (TensorDesc(tuple(shape), dtype, xs[0].device),)

    def cpu(self, *xs):
        return np.concatenate(xs, axis=self.axis)

    def vjp(self, inputs, outputs, grads):
        return list(_core.apply(SplitLike(self.axis), grads[0], *inputs))

    def cuda_source(self, ctype: str = "float") -> str:
        return _piece_source("concat", ctype, True,
                             "one launch per input: y[:, offset:offset + len, :] = x, y viewed as (outer, n,\n"
                             "    // inner) around the axis and x as (outer, len, inner); inputs of another\n"
                             "    // dtype are cast to y's first")

    def cuda(self, be, *xs):
        (out,) = self.infer(*_descs(xs))
        ax = self.axis % len(out.shape)
        y = be.empty(out.shape, out.dtype)
        _pieces(be, self, y, ax, [be.cast(x, out.dtype) for x in xs], [x.shape[ax] for x in xs], scatter=True)
        return y


_SPLIT_WHAT = ("one launch per output: y = x[:, offset:offset + len, :], x viewed as\n"
               "    // (outer, n, inner) around the axis and y as (outer, len, inner)")


class SplitLike(Op):
    """Split x along axis into pieces sized like refs (concat's backward)."""
    name = "SplitLike"
    reduce_broadcast = False
    check_params = ({"axis": 0},)
    check_shapes = (((4, 3), (1, 3), (3, 3)), ((0, 3), (0, 3)))
    attrs = ("axis",)

    def __init__(self, axis):
        self.axis = int(axis)
        self.shape_only_inputs = tuple(range(1, 4096))

    def infer(self, x, *refs):
        return tuple(TensorDesc(r.shape, x.dtype, x.device) for r in refs)

    def cpu(self, x, *refs):
        if len(refs) == 1:    # one output: the array itself, as backward graphs call it
            return x
        bounds = np.cumsum([r.shape[self.axis] for r in refs])[:-1]
        return tuple(np.split(x, bounds, axis=self.axis))

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Concat(self.axis), *grads)] + [None] * (len(inputs) - 1)

    def cuda_source(self, ctype: str = "float") -> str:
        return _piece_source("split_like", ctype, False, _SPLIT_WHAT)

    def cuda(self, be, x, *refs):
        if len(refs) == 1:      # as the cpu: the array itself
            return x
        ax = self.axis % x.ndim
        ys = [be.empty(r.shape, x.dtype) for r in refs]     # refs may be shape-only
        _pieces(be, self, x, ax, ys, [r.shape[ax] for r in refs], scatter=False)
        return tuple(ys)


# ---------------------------------------------------------------- split / stack
# CUDA kernels of the copy ops below: one thread per output element
# (grid-stride loop); the caller collapses the shape to (outer, axis, inner)
# and passes it as integer arguments after the pointers.
def _split_sizes(sections, n):
    """Piece sizes along an axis of length ``n``: ``sections`` is a number of
    parts (np.array_split / MegEngine: the first ``n % parts`` pieces are one
    longer) or a tuple of split indices (MegEngine: non-decreasing, <= n)."""
    if isinstance(sections, int):
        return [(n + sections - i - 1) // sections for i in range(sections)]
    bounds = (0,) + tuple(sections) + (n,)
    return [bounds[i + 1] - bounds[i] for i in range(len(sections) + 1)]


class Split(Op):
    """Split x along ``axis`` (MegEngine's ``F.split``): ``sections`` is an int
    (that many pieces, as np.array_split) or a tuple of split indices."""
    name = "Split"
    reduce_broadcast = False
    attrs = ("axis", "sections")

    def __init__(self, axis=0, sections=1):
        self.axis = int(axis)
        if isinstance(sections, (int, np.integer)):
            self.sections = int(sections)
        else:
            self.sections = tuple(int(s) for s in sections)

    @property
    def n_out(self):
        return self.sections if isinstance(self.sections, int) else len(self.sections) + 1

    def infer(self, x):
        if x.shape is None:       # traced: checked when the shape is known
            return tuple(TensorDesc(None, x.dtype, x.device) for _ in range(max(self.n_out, 0)))
        if isinstance(self.sections, int) and self.sections <= 0:
            raise self.error(f"the number of sections must be positive, got {self.sections}", x)
        nd = x.ndim
        if not -nd <= self.axis < nd:
            raise self.error(f"axis {self.axis} is out of range for {nd} dimensions", x)
        ax = self.axis % nd
        n = x.shape[ax]
        if isinstance(self.sections, int) and self.sections > n:
            raise self.error(f"axis {ax} of size {n} cannot be split into {self.sections} sections", x)
        sizes = _split_sizes(self.sections, n)
        if any(s < 0 for s in sizes):
            raise self.error(f"split indices {self.sections} must be non-decreasing and within "
                             f"[0, {n}] (axis {ax} has size {n})", x)
        return tuple(TensorDesc(x.shape[:ax] + (s,) + x.shape[ax + 1:], x.dtype, x.device) for s in sizes)

    def cpu(self, x):
        self.infer(TensorDesc(x.shape, x.dtype))     # bad input: Split's own error
        ax = self.axis % x.ndim
        sizes = _split_sizes(self.sections, x.shape[ax])
        if len(sizes) == 1:
            return x
        return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=ax))

    def vjp(self, inputs, outputs, grads):
        # a piece without a gradient gets zeros (filled in by the core)
        return [_apply1(Concat(self.axis), *grads) if grads else None]

    def cuda_source(self, ctype: str = "float") -> str:
        return _piece_source("split", ctype, False, _SPLIT_WHAT)

    def cuda(self, be, x):
        outs = self.infer_arrays(x)
        if len(outs) == 1:
            return x
        ax = self.axis % x.ndim
        ys = [be.empty(o.shape, o.dtype) for o in outs]
        _pieces(be, self, x, ax, ys, [o.shape[ax] for o in outs], scatter=False)
        return tuple(ys)


def _stack_axis(op, axis, nd, descs):
    if not -(nd + 1) <= axis <= nd:
        raise op.error(f"axis {axis} is out of range for stacking {nd}-dimensional inputs", *descs)
    return axis % (nd + 1)


class Stack(Op):
    """Stack equally shaped inputs along a new ``axis``."""
    name = "Stack"
    reduce_broadcast = False
    attrs = ("axis",)

    def __init__(self, axis=0):
        self.axis = int(axis)

    input_dtypes = dtypes.promoted_inputs      # MegEngine's: one dtype for all inputs

    def infer(self, *xs):
        if not xs:
            raise self.error("needs at least one input")
        dtype = dtypes.promote_types(*[x.dtype for x in xs])
        if any(x.shape is None for x in xs):
            return (TensorDesc(None, dtype, xs[0].device),)
        shape = xs[0].shape
        if any(x.shape != shape for x in xs):
            raise self.error("all inputs must have the same shape", *xs)
        ax = _stack_axis(self, self.axis, len(shape), xs)
        return (TensorDesc(shape[:ax] + (len(xs),) + shape[ax:], dtype, xs[0].device),)

    def cpu(self, *xs):
        self.infer(*[TensorDesc(x.shape, x.dtype) for x in xs])
        return np.stack(xs, axis=self.axis)

    def vjp(self, inputs, outputs, grads):
        gs = _core.apply(Unstack(self.axis, len(inputs)), grads[0])
        out = []
        for x, g in zip(inputs, gs):
            if x.dtype != g.dtype and x.dtype.kind in "fc":
                g = _apply1(Cast(x.dtype), g)
            out.append(g)
        return out

    def cuda_source(self, ctype: str = "float") -> str:
        return _piece_source("stack", ctype, True,
                             "one launch per input k: y[:, k, :] = x (offset k, len 1), y viewed as\n"
                             "    // (outer, n, inner) around the new axis and x as (outer, 1, inner)")

    def cuda(self, be, *xs):
        (out,) = self.infer(*_descs(xs))
        ax = self.axis % len(out.shape)
        y = be.empty(out.shape, out.dtype)
        _pieces(be, self, y, ax, [be.cast(x, out.dtype) for x in xs], [1] * len(xs), scatter=True)
        return y


class Unstack(Op):
    """The ``n`` slices of x along ``axis``, that axis removed (Stack's backward)."""
    name = "Unstack"
    reduce_broadcast = False
    attrs = ("axis", "n")

    def __init__(self, axis=0, n=1):
        self.axis, self.n = int(axis), int(n)

    def infer(self, x):
        if x.shape is None:
            return tuple(TensorDesc(None, x.dtype, x.device) for _ in range(self.n))
        nd = x.ndim
        if nd == 0 or not -nd <= self.axis < nd:
            raise self.error(f"axis {self.axis} is out of range for {nd} dimensions", x)
        ax = self.axis % nd
        if x.shape[ax] != self.n:
            raise self.error(f"axis {ax} has size {x.shape[ax]}, expected {self.n}", x)
        shape = x.shape[:ax] + x.shape[ax + 1:]
        return tuple(TensorDesc(shape, x.dtype, x.device) for _ in range(self.n))

    def cpu(self, x):
        ax = self.axis % x.ndim
        parts = tuple(np.take(x, i, axis=ax) for i in range(self.n))
        return parts[0] if self.n == 1 else parts

    def vjp(self, inputs, outputs, grads):
        return [_apply1(Stack(self.axis), *grads)]

    def cuda_source(self, ctype: str = "float") -> str:
        return _piece_source("unstack", ctype, False,
                             "one launch per output k: y = x[:, k, :] (offset k, len 1), x viewed as\n"
                             "    // (outer, n, inner) around the axis and y as (outer, 1, inner)")

    def cuda(self, be, x):
        outs = self.infer_arrays(x)
        ax = self.axis % x.ndim
        ys = [be.empty(o.shape, o.dtype) for o in outs]
        _pieces(be, self, x, ax, ys, [1] * self.n, scatter=False)
        return ys[0] if self.n == 1 else tuple(ys)     # as the cpu


# ---------------------------------------------------------------- CUDA helpers
# of the shape ops above (same conventions as the split / stack kernels; a
# rank not known from the op's attributes comes as a ``gc_dims`` struct by
# value, at most GC_MAX_DIMS = 8 dimensions).
CUDA_CTYPES = {"float32": "float", "float64": "double", "int8": "signed char", "int16": "short",
               "int32": "int", "int64": "long long", "uint8": "unsigned char", "uint16": "unsigned short",
               "uint32": "unsigned int", "uint64": "unsigned long long", "bool": "bool"}


# one guarded gc_dims definition for every op's CUDA source (indexing, linalg
# and reduce import it from here)
_DIMS = ("#ifndef GC_DIMS_DEFINED\n#define GC_DIMS_DEFINED\n#define GC_MAX_DIMS 8\n"
         "struct gc_dims { int n; long long d[GC_MAX_DIMS]; };\n#endif\n")

# y = x.transpose(perm): one thread per y element
_TRANSPOSE = Kernel("transpose", "const T* __restrict__ x, T* __restrict__ y, gc_dims xs, gc_dims perm", """
    long long t = idx, off = 0;
    for (int d = ND - 1; d >= 0; --d) {     // y's axis d is x's axis perm.d[d]
        const long long n = xs.d[perm.d[d]];
        off += (t % n) * xstr[perm.d[d]]; t /= n;
    }
    y[idx] = x[off];""", over="total", setup="""
    const int ND = xs.n;
    long long xstr[GC_MAX_DIMS], total = 1;     // x's element strides
    for (int d = ND - 1; d >= 0; --d) { xstr[d] = total; total *= xs.d[d]; }""")
# (batch, rows, cols) to (batch, cols, rows) through 32 x 32 tiles: a block per tile
_TRANSPOSE_TILED = Kernel("transpose_tiled", "const T* __restrict__ x, T* __restrict__ y, long long batch, "
                          "long long rows, long long cols", """
    const long long b = t / (tr * tc), r0 = (t / tc) % tr * 32, c0 = t % tc * 32;
    for (unsigned j = threadIdx.y; j < 32; j += blockDim.y) {
        const long long r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = x[(b * rows + r) * cols + c];
    }
    __syncthreads();
    for (unsigned j = threadIdx.y; j < 32; j += blockDim.y) {
        const long long c = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && c < cols) y[(b * cols + c) * rows + r] = tile[threadIdx.x][j];
    }
    __syncthreads();     // the tile is read before the next one is written""",
                          over="batch * tr * tc", index="t", per="block", setup="""
    __shared__ T tile[32][33];          // 33: a column of the tile spans all banks
    const long long tr = (rows + 31) / 32, tc = (cols + 31) / 32;""")


def _prod(shape) -> int:
    return int(math.prod(shape))


def _merge_axes(shape, perm):
    """(x's shape, perm) of the same transpose with fewer axes: size-1 axes
    dropped, and axes that stay adjacent and in order in y merged."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    rank = {a: i for i, a in enumerate(kept)}
    groups = []                         # runs of consecutive x axes, in y's order
    for a in perm:
        if shape[a] == 1:
            continue
        if groups and rank[groups[-1][-1]] + 1 == rank[a]:
            groups[-1].append(a)
        else:
            groups.append([a])
    by_x = sorted(range(len(groups)), key=lambda g: groups[g][0])
    merged = tuple(_prod([shape[a] for a in groups[g]]) for g in by_x)
    pos = {g: i for i, g in enumerate(by_x)}
    return merged, tuple(pos[g] for g in range(len(groups)))


def _check_broadcast(op, small, big):
    """``small`` must broadcast to ``big``: a kernel given other shapes would
    read out of bounds."""
    try:
        ok = tuple(np.broadcast_shapes(small, big)) == tuple(big)
    except ValueError:
        ok = False
    if not ok:
        raise op.error(f"shape {tuple(small)} does not broadcast to {tuple(big)}")


def _broadcast(be, op, x, shape):
    """``op``'s broadcast kernel: x broadcast to ``shape``."""
    shape = tuple(shape)
    _check_broadcast(op, x.shape, shape)
    if x.size == _prod(shape):          # only size-1 axes added: the same elements
        return x.reshape(shape)
    y = be.empty(shape, x.dtype)
    be.launch_n(be.kernel(op, be.ctype(x.dtype)), y.size, x, y, be.dims(x.shape), be.dims(shape))
    return y


# the sum-to kernels add up at most this many elements per thread
_LONG_SUM = 1024


def _sum_to(be, op, x, shape):
    """``op``'s sum-to kernel: x summed down to ``shape`` (as ``sum_to``)."""
    shape = tuple(shape)
    if x.size == _prod(shape):          # nothing to add up (as the cpu, a reshape)
        return x.reshape(shape)
    extra = _extra_leading_ones(x.shape, shape)
    if extra:
        return _sum_to(be, op, x, shape[extra:]).reshape(shape)
    _check_broadcast(op, shape, x.shape)
    lead = x.ndim - len(shape)
    axes = tuple(a for a in range(x.ndim) if a < lead or (shape[a - lead] == 1 and x.shape[a] != 1))
    if x.dtype.kind == "f" and _prod([x.shape[a] for a in axes]) > _LONG_SUM:
        # long sums: the reduction's kernels split them over many threads
        return be.reduce("sum", x, axes).reshape(shape)
    y = be.empty(shape, x.dtype)
    be.launch_n(be.kernel(op, be.ctype(x.dtype)), y.size, x, y, be.dims(x.shape), be.dims(shape))
    return y


def _copy_source(op_name, ctype, what):
    return Kernel(op_name, "const T* __restrict__ x, T* __restrict__ y, long long total",
                  f"y[idx] = x[idx];   // {what}: a contiguous copy of total elements", over="total").source(ctype)


def _piece_source(op_name, ctype, scatter, what):
    """``gc_<op_name>_<ctype>(x, y, outer, n, offset, len, inner)`` (long
    longs after the pointers): copies one piece (outer, len, inner) into
    (``scatter``) or out of the big array (outer, n, inner), at ``offset``
    along its middle axis. One thread per piece element, grid-stride loop."""
    big = "(o * n + offset + j) * inner + i"
    return Kernel(op_name, "const T* __restrict__ x, T* __restrict__ y, long long outer, long long n, "
                  "long long offset, long long len, long long inner", f"""
        const long long i = idx % inner; const long long t = idx / inner;
        const long long j = t % len; const long long o = t / len;
        {f"y[{big}] = x[idx];" if scatter else f"y[idx] = x[{big}];"}   // {what}""",
                  over="total", setup="const long long total = outer * len * inner;").source(ctype)


def _pieces(be, op, big, axis, pieces, lengths, scatter):
    """Launch ``op``'s piece kernel once per piece: piece k spans
    ``lengths[k]`` entries of ``big``'s ``axis``, the pieces in order;
    ``scatter``: write them into ``big``, else read them out of it."""
    outer, n, inner = _prod(big.shape[:axis]), big.shape[axis], _prod(big.shape[axis + 1:])
    kernel = be.kernel(op, be.ctype(big.dtype))
    offset = 0
    for piece, length in zip(pieces, lengths):
        src, dst = (piece, big) if scatter else (big, piece)
        be.launch_n(kernel, piece.size, src, dst, outer, n, offset, length, inner)
        offset += length


def _descs(arrays):
    return [TensorDesc(a.shape, a.dtype, "cuda") for a in arrays]


def _view(op, *arrays):
    """A reshape op on cuda: the input's memory under the inferred shape (no
    copy, like NumPy's view on the cpu; arrays are never written in place)."""
    (out,) = op.infer(*_descs(arrays))
    return arrays[0].reshape(out.shape)


def _broadcast_source(op_name, ctype, what):
    """y (shape ys, contiguous) = x broadcast: x contiguous of shape xs,
    right-aligned to ys (size-1 and missing axes repeat)."""
    return Kernel(op_name, "const T* __restrict__ x, T* __restrict__ y, gc_dims xs, gc_dims ys", """
        long long t = idx, off = 0, stride = 1;
        for (int d = ND - 1; d >= 0; --d) {
            const long long c = t % OUT[d]; t /= OUT[d];
            const int j = d - (ND - xs.n);           // x's axis under y's axis d
            if (j >= 0) { if (xs.d[j] != 1) off += c * stride; stride *= xs.d[j]; }
        }
        y[idx] = x[off];""", over="total", setup=f"""
        const int ND = ys.n; const long long* OUT = ys.d;   // {what}
        long long total = 1;
        for (int d = 0; d < ND; ++d) total *= OUT[d];""").source(ctype, helpers=_DIMS)


def _sum_to_source(op_name, ctype, what):
    """``gc_<op_name>_<ctype>(x, y, xs, ys)``: y (shape ys, ``what``) = x
    (shape xs) summed over its broadcast axes: x's leading axes, and those
    where ys (right-aligned) has 1 and x more. One thread per output element
    loops over every x element that maps to it (grid-stride loop)."""
    return Kernel(op_name, "const T* __restrict__ x, T* __restrict__ y, gc_dims xs, gc_dims ys", """
        long long t = idx, base = 0, stride = 1;   // x offset of the kept coordinates
        for (int d = xs.n - 1; d >= lead; --d) {
            const long long c = t % YS[d - lead]; t /= YS[d - lead];
            if (!summed[d]) base += c * stride;
            stride *= xs.d[d];
        }
        T acc = 0;
        for (long long r = 0; r < count; ++r) {  // r: coordinates over the summed axes
            long long u = r, off = base, s = 1;
            for (int d = xs.n - 1; d >= 0; --d) {
                if (summed[d]) { off += (u % xs.d[d]) * s; u /= xs.d[d]; }
                s *= xs.d[d];
            }
            acc += x[off];
        }
        y[idx] = acc;""", over="total", setup=f"""
        // x: contiguous of shape xs; y: contiguous, shape ys ({what}) right-aligned to xs
        const int NY = ys.n; const long long* YS = ys.d;
        const int lead = xs.n - NY;
        bool summed[GC_MAX_DIMS];
        long long total = 1, count = 1;
        for (int d = 0; d < NY; ++d) total *= YS[d];
        for (int d = 0; d < xs.n; ++d) {{
            summed[d] = d < lead || (YS[d - lead] == 1 && xs.d[d] != 1);
            if (summed[d]) count *= xs.d[d];
        }}""").source(ctype, helpers=_DIMS)
