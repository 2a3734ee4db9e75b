"""Shape functions: reshape, transpose, broadcast, add or remove axes, join
and split, cast and copy, and composites of those (repeat, tile, roll,
meshgrid, pixel_shuffle). Their ops: ops/shape.py.

Example::

    >>> F.reshape(gc.tensor(np.zeros(6)), (2, 3)).shape
    (2, 3)
"""
from __future__ import annotations

import operator
from typing import List, Optional, Sequence, Union

import numpy as np

from .._core import Tensor, apply as _apply
from ..op import OpError
from ..ops.shape import (Broadcast, Cast, Concat, Copy, ExpandDims, Reshape, Split, Squeeze, Stack,
                         StopGradient, Transpose)
from ._args import _axis_in, _axis_key, _int_arg, _int_or_err, _int_tuple, _ints, _t, builtins_max
from ..op import ArgumentError


def reshape(inp: Tensor, target_shape: Sequence[int]) -> Tensor:
    """``inp`` with the same elements in ``target_shape``; one entry may be -1
    (inferred from the others).

    Example::

        >>> F.reshape(gc.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), (2, -1)).numpy()
        array([[1., 2., 3.],
               [4., 5., 6.]], dtype=float32)
    """
    if isinstance(target_shape, int):
        target_shape = (target_shape,)
    if isinstance(target_shape, (tuple, list)) and any(isinstance(d, (float, np.floating)) for d in target_shape):
        # integers only: a float size, even 2.0, is a TypeError (as NumPy, MegEngine)
        raise TypeError(f"reshape: target_shape entries must be integers, got {tuple(target_shape)}")
    return _apply(Reshape(_ints("reshape", "target_shape", target_shape)), _t(inp))[0]


def transpose(inp: Tensor, pattern: Optional[Sequence[int]] = None) -> Tensor:
    """``inp`` with its axes permuted by ``pattern`` (reversed when None). As
    in MegEngine, an ``'x'`` in the pattern adds an axis of size 1, and an
    axis of size 1 may be left out.

    Example::

        >>> F.transpose(gc.tensor(np.zeros((2, 3))), (1, "x", 0)).shape
        (3, 1, 2)
    """
    x = _t(inp)
    if pattern is None:
        if x.ndim is None:     # a traced tensor (a vjp): its rank is not known
            raise TypeError("transpose: reversing the axes needs the rank, which is unknown while a "
                            "backward graph is traced; pass the pattern, e.g. (1, 0)")
        pattern = tuple(range(x.ndim))[::-1]
    pattern = tuple(pattern)
    if any(isinstance(p, str) for p in pattern) or (x.ndim is not None and 0 < len(pattern) < x.ndim):
        return _dimshuffle(x, pattern)
    try:
        pattern = tuple(operator.index(p) for p in pattern)
    except TypeError:
        raise TypeError(f"transpose: pattern entries must be ints (or 'x'), got {pattern}") from None
    return _apply(Transpose(pattern), x)[0]


def _dimshuffle(x, pattern):
    """MegEngine's transpose pattern with ``'x'`` entries: the listed axes in
    that order, a new axis of size 1 at each ``'x'``; an axis left out must
    have size 1 and is dropped. ``(1, 'x', 0)``: (A, B) -> (B, 1, A). Axes
    are non-negative here (MegEngine's low-level -1 means 'x', NumPy's the
    last axis: neither is guessed).

    Example::

        >>> F.transpose(gc.tensor(np.zeros((2, 3))), (0, "x", 1)).shape
        (2, 1, 3)
    """
    pattern = tuple(pattern)
    nd = x.ndim
    axes = []
    for p in pattern:
        if isinstance(p, str):
            if p != "x":
                raise ArgumentError(f"transpose: pattern entries are axes or 'x', got {p!r} in {pattern}")
            continue
        try:
            a = p.__index__()
        except (AttributeError, TypeError):
            raise TypeError(f"transpose: pattern entries are axes or 'x', got {p!r} in {pattern}") from None
        if not 0 <= a < nd:
            raise ArgumentError(f"transpose: axis {a} in {pattern} is out of range for a tensor of shape "
                             f"{x.shape} (a pattern with 'x' or fewer entries than axes takes axes "
                             f"0..{nd - 1} and 'x')")
        axes.append(a)
    if len(set(axes)) != len(axes):
        raise ArgumentError(f"transpose: pattern {pattern} repeats an axis")
    dropped = [a for a in range(nd) if a not in axes]
    if any(x.shape[a] != 1 for a in dropped):
        raise ArgumentError(f"transpose: pattern {pattern} leaves out axes {dropped} of a tensor of shape "
                         f"{x.shape}; only axes of size 1 can be left out")
    y = transpose(x, tuple(axes) + tuple(dropped)) if nd else x
    it = iter(y.shape)
    shape = tuple(1 if isinstance(p, str) else next(it) for p in pattern)
    return reshape(y, shape)


class ShapeError(OpError, RuntimeError):
    """A shape that does not fit an op: an ``OpError`` (a ValueError) here,
    and the RuntimeError MegEngine raises for the same input."""


def broadcast_to(inp: Tensor, shape: Sequence[int]) -> Tensor:
    """``inp`` broadcast to ``shape``; as in MegEngine, a ``None`` in
    ``shape`` keeps the size of the matching (right-aligned) axis of ``inp``.

    Example::

        >>> F.broadcast_to(gc.tensor(np.zeros((1, 2, 3))), (4, None, 3)).shape
        (4, 2, 3)
    """
    x = _t(inp)
    if isinstance(shape, Tensor):
        shape = shape.numpy().reshape(-1).tolist()
    elif isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = list(shape)
    except TypeError:
        raise TypeError(f"broadcast_to: shape must be a sequence of ints, got {shape!r}") from None
    for i, d in enumerate(shape):
        if d is None:
            lead = len(shape) - x.ndim
            if i < lead:
                raise ArgumentError(f"broadcast_to: None at position {i} of {tuple(shape)} has no axis of "
                                 f"inp (shape {x.shape}) to take its size from")
            shape[i] = x.shape[i - lead]
        elif _int_or_err("broadcast_to", "shape entries", d) < 0:
            raise ArgumentError(f"broadcast_to: sizes must be >= 0 (or None to keep the input's), got {tuple(shape)}")
    try:
        return _apply(Broadcast(_ints("broadcast_to", "shape", shape)), x)[0]
    except OpError as exc:
        raise ShapeError(str(exc)) from None


def expand_dims(inp: Tensor, axis: Union[int, Sequence[int]]) -> Tensor:
    """``inp`` with a new axis of size 1 at ``axis`` (an int or a sequence of
    them, positions in the result).

    Example::

        >>> x = gc.tensor([1.0, 2.0])
        >>> F.expand_dims(x, 0).shape, F.expand_dims(x, (0, 2)).shape
        ((1, 2), (1, 2, 1))
    """
    try:
        return _apply(ExpandDims(_axis_key(axis)), _t(inp))[0]
    except OpError as exc:       # an axis out of range: MegEngine's RuntimeError too
        raise ShapeError(str(exc)) from None
    except (TypeError, ValueError):      # an axis that is no int: 'a', 1.5, None
        _check_axes("expand_dims", axis)
        raise


def squeeze(inp: Tensor, axis: Optional[Union[int, Sequence[int]]] = None) -> Tensor:
    """``inp`` without its size-1 axes: those in ``axis`` (an int or a sequence),
    or every one when None.

    Example::

        >>> x = gc.tensor(np.zeros((1, 3, 1), "float32"))
        >>> F.squeeze(x).shape, F.squeeze(x, 2).shape
        ((3,), (1, 3))
    """
    try:
        return _apply(Squeeze(_axis_key(axis)), _t(inp))[0]
    except (TypeError, ValueError) as exc:
        if not isinstance(exc, OpError) and axis is not None:
            _check_axes("squeeze", axis)
        raise


def _check_axes(name: str, axis) -> None:
    """A TypeError naming ``name`` when ``axis`` is not an int or a sequence
    of ints (called after an op rejected it with a less helpful message)."""
    if isinstance(axis, (tuple, list)):
        _ints(name, "axis", axis)
    else:
        _int_or_err(name, "axis", axis)


def flatten(inp: Tensor, start_axis: int = 0, end_axis: int = -1) -> Tensor:
    """``inp`` with the axes ``start_axis .. end_axis`` (both included) merged
    into one, MegEngine's ``F.flatten``; a 0-d tensor becomes shape (1,).

    Example::

        >>> x = gc.tensor(np.zeros((2, 3, 4, 5), "float32"))
        >>> F.flatten(x).shape, F.flatten(x, 1).shape, F.flatten(x, 1, 2).shape
        ((120,), (2, 60), (2, 12, 5))
        >>> F.flatten(gc.tensor(np.zeros((0, 3, 4))), 1).shape
        (0, 12)
    """
    x = _t(inp)
    nd = x.ndim
    if nd == 0:
        return reshape(x, (1,))
    s, e = _axis_in("flatten", start_axis, nd), _axis_in("flatten", end_axis, nd)
    if s > e:
        raise ArgumentError(f"flatten: start_axis {start_axis} comes after end_axis {end_axis} "
                         f"for a tensor of shape {x.shape}")
    # the size spelled out: -1 is ambiguous where another axis has size 0
    shape = x.shape[:s] + (int(np.prod(x.shape[s:e + 1])),) + x.shape[e + 1:]
    return reshape(x, shape)


def concat(inps: Sequence[Tensor], axis: int = 0, device: Optional[str] = None) -> Tensor:
    """Join tensors along an existing ``axis``; ``device`` (MegEngine's
    argument) is where the result goes: the inputs are moved there first,
    so they may come from different devices (without it they must share one).

    Example::

        >>> F.concat([gc.tensor([[1.0, 2.0]]), gc.tensor([[3.0, 4.0]])], axis=0).numpy()
        array([[1., 2.],
               [3., 4.]], dtype=float32)
    """
    return _apply(Concat(_int_or_err("concat", "axis", axis)), *_on_device("concat", inps, device))[0]


def _on_device(name: str, inps, device) -> list:
    """concat's and stack's inputs, moved to ``device`` when it is given."""
    ts = _tensor_list(name, inps)
    return ts if device is None else [t.to(device) for t in ts]


def _tensor_list(name: str, inps) -> list:
    """The tensors of a list argument (concat, stack): a list or tuple of at
    least one; a Tensor itself is not iterated (that would use its rows)."""
    if not isinstance(inps, (list, tuple)):
        if isinstance(inps, Tensor) or not hasattr(inps, "__iter__"):
            raise TypeError(f"{name}: expects a list of tensors, got {type(inps).__name__}")
        inps = list(inps)
    if not inps:
        raise ArgumentError(f"{name}: expects at least one tensor, got an empty list")
    return [_t(x, name=name) for x in inps]


def split(inp: Tensor, nsplits_or_sections: Union[int, Sequence[int]], axis: int = 0) -> List[Tensor]:
    """Split ``inp`` along ``axis`` into a list of tensors, MegEngine's
    ``F.split``: an int is a number of pieces (sizes as np.array_split: the
    first ``size % n`` pieces one longer), a list gives the split indices.

    Example::

        >>> [p.shape for p in F.split(gc.tensor(np.zeros((5, 2))), [1, 3])]
        [(1, 2), (2, 2), (2, 2)]
    """
    if isinstance(nsplits_or_sections, (int, np.integer)):
        sections = int(nsplits_or_sections)
    else:
        sections = _ints("split", "nsplits_or_sections", nsplits_or_sections)
    return list(_apply(Split(_int_or_err("split", "axis", axis), sections), _t(inp)))


def stack(inps: Sequence[Tensor], axis: int = 0, device: Optional[str] = None) -> Tensor:
    """Stack equally shaped tensors along a new ``axis`` (``device``, as in
    MegEngine and ``concat``: where the inputs are moved and the result made).

    Example::

        >>> x, y = gc.tensor([1.0, 2.0, 3.0]), gc.tensor([4.0, 5.0, 6.0])
        >>> F.stack([x, y], axis=1).numpy()
        array([[1., 4.],
               [2., 5.],
               [3., 6.]], dtype=float32)
    """
    return _apply(Stack(_int_or_err("stack", "axis", axis)), *_on_device("stack", inps, device))[0]


def copy(inp: Tensor, device: Optional[str] = None) -> Tensor:
    """A recorded copy of ``inp`` in memory of its own (on ``device`` when
    given), C-contiguous: what to export by DLPack when the tensor is a
    reversed view (``t[::-1].copy()``), and what stays apart from memory
    ``inp`` shares with NumPy or PyTorch.

    Example::

        >>> t = gc.tensor([1.0, 2.0, 3.0])
        >>> c = F.copy(t[::-1])
        >>> c.numpy().tolist(), np.shares_memory(c.numpy(), t.numpy())
        ([3.0, 2.0, 1.0], False)
    """
    x = _t(inp)
    out = _apply(Copy(x.device), x)[0]
    return out if device is None else out.to(device)


def stop_gradient(x: Tensor) -> Tensor:
    """``x`` with no gradient flowing back through it.

    Example::

        >>> x = gc.tensor([2.0, 3.0])
        >>> gm = gc.GradManager().attach([x])
        >>> with gm:
        ...     gm.backward((x * F.stop_gradient(x)).sum())     # d/dx of x * c, c = x held constant
        >>> x.grad.numpy()
        array([2., 3.], dtype=float32)
    """
    return _apply(StopGradient(), _t(x))[0]


def astype(x: Tensor, dtype: Union[str, np.dtype]) -> Tensor:
    """``x`` converted to ``dtype`` (``x`` itself when it already has it).

    Example::

        >>> F.astype(gc.tensor([1.7, -1.7]), "int32").numpy()
        array([ 1, -1], dtype=int32)
    """
    x = _t(x)
    dt = _numeric_dtype("astype", dtype)
    if x.dtype == dt:
        return x
    return _apply(Cast(dt), x)[0]


def _numeric_dtype(name: str, dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype a tensor can hold (bool, integer, float,
    complex), or an error naming ``name`` (np.dtype(None) would be float64,
    np.dtype(str) a string tensor)."""
    if dtype is None:
        raise TypeError(f"{name}: dtype must be given, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None
    if dt.kind not in "biufc":
        raise TypeError(f"{name}: cannot make a tensor of dtype {dt} (from {dtype!r}); "
                        f"use a bool, integer or floating-point dtype")
    return dt


def swapaxes(inp: Tensor, axis1: int, axis2: int) -> Tensor:
    """``inp`` with axes ``axis1`` and ``axis2`` interchanged.

    Example::

        >>> F.swapaxes(gc.tensor(np.zeros((2, 3, 4))), 0, 2).shape
        (4, 3, 2)
    """
    x = _t(inp)
    a, b = _axis_in("swapaxes", axis1, x.ndim), _axis_in("swapaxes", axis2, x.ndim)
    pattern = list(range(x.ndim))
    pattern[a], pattern[b] = b, a
    return transpose(x, pattern)


# ---- composites: repeating, rolling, grids, pixel shuffle
def repeat(inp: Tensor, repeats: int, axis: Optional[int] = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``axis`` (None: of the
    flattened input), as ``np.repeat`` with an int ``repeats``.

    Example::

        >>> F.repeat(gc.tensor([[1, 2], [3, 4]]), 2, axis=1).numpy()
        array([[1, 1, 2, 2],
               [3, 3, 4, 4]], dtype=int32)
    """
    repeats = _int_arg("repeat", "repeats", repeats)
    x = _t(inp)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    ax = _axis_in("repeat", axis, x.ndim)
    shape = x.shape
    wide = broadcast_to(expand_dims(x, ax + 1), shape[:ax + 1] + (repeats,) + shape[ax + 1:])
    return reshape(wide, shape[:ax] + (shape[ax] * repeats,) + shape[ax + 1:])


def tile(inp: Tensor, reps: Sequence[int]) -> Tensor:
    """``inp`` repeated ``reps[i]`` times along axis ``i``, as ``np.tile``:
    the shorter of ``reps`` and the shape is padded with leading 1s.

    Example::

        >>> F.tile(gc.tensor([[1, 2], [3, 4]]), (2, 1)).numpy()
        array([[1, 2],
               [3, 4],
               [1, 2],
               [3, 4]], dtype=int32)
    """
    x = _t(inp)
    reps = tuple(_int_arg("tile", "reps", r) for r in _int_tuple("tile", "reps", reps))
    nd = builtins_max(len(reps), x.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - x.ndim) + x.shape
    pairs = list(zip(reps, shape))
    wide = broadcast_to(reshape(x, [v for _, d in pairs for v in (1, d)]), [v for p in pairs for v in p])
    return reshape(wide, tuple(r * d for r, d in pairs))


def roll(inp: Tensor, shift: Union[int, Sequence[int]],
         axis: Union[int, Sequence[int], None] = None) -> Tensor:
    """Shift elements by ``shift`` along ``axis``, wrapping around, as
    ``np.roll``: ``shift`` and ``axis`` may be matching sequences; with
    ``axis=None`` the flattened tensor is rolled and the shape restored.

    Example::

        >>> F.roll(gc.tensor([1, 2, 3, 4]), 1).numpy()
        array([4, 1, 2, 3], dtype=int32)
    """
    x = _t(inp)
    if axis is None:
        if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)):
            raise TypeError(f"roll: with axis=None, shift must be an int, got {shift!r}")
        return reshape(roll(reshape(x, (-1,)), shift, 0), x.shape)
    shifts, axes = _int_tuple("roll", "shift", shift), _int_tuple("roll", "axis", axis)
    if len(shifts) != len(axes):
        raise ArgumentError(f"roll: shift {shift!r} and axis {axis!r} must have the same length")
    out = x
    for s, a in zip(shifts, axes):
        a = _axis_in("roll", a, x.ndim)
        n = x.shape[a]
        k = s % n if n else 0
        if k:
            head, tail = split(out, [n - k], a)
            out = concat([tail, head], a)
    return copy(x) if out is x else out


def meshgrid(*inputs: Tensor, indexing: str = "xy") -> list:
    """Coordinate grids from 1-d tensors, as ``np.meshgrid``: each result has
    shape (N1, N2, ...) with ``indexing="ij"``; with "xy" (the default) the
    first two are swapped, (N2, N1, ...).

    Example::

        >>> xv, yv = F.meshgrid(gc.tensor([0.0, 1.0, 2.0]), gc.tensor([5.0, 6.0]))
        >>> xv.numpy()
        array([[0., 1., 2.],
               [0., 1., 2.]], dtype=float32)
    """
    if indexing not in ("xy", "ij"):
        raise ArgumentError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    xs = [_t(v) for v in inputs]
    for i, v in enumerate(xs):
        if v.ndim != 1:
            raise ArgumentError(f"meshgrid: every input must be 1-d, input {i} has shape {v.shape}")
    axes = list(range(len(xs)))
    if indexing == "xy" and len(xs) >= 2:
        axes[0], axes[1] = 1, 0
    shape = [0] * len(xs)
    for v, a in zip(xs, axes):
        shape[a] = v.shape[0]
    return [broadcast_to(reshape(v, [shape[a] if j == a else 1 for j in range(len(xs))]), shape)
            for v, a in zip(xs, axes)]


def pixel_shuffle(inp: Tensor, upscale_factor: int) -> Tensor:
    """Rearrange (..., C * r * r, H, W) into (..., C, H * r, W * r) for
    ``r = upscale_factor``, MegEngine's ``F.nn.pixel_shuffle`` (PyTorch's
    element order).

    Example::

        >>> x = gc.tensor(np.arange(4, dtype="float32").reshape(1, 4, 1, 1))
        >>> F.nn.pixel_shuffle(x, 2).numpy()
        array([[[[0., 1.],
                 [2., 3.]]]], dtype=float32)
    """
    r = _int_arg("pixel_shuffle", "upscale_factor", upscale_factor, low=1)
    x = _t(inp)
    if x.ndim < 3 or x.shape[-3] % (r * r):
        raise ArgumentError(f"pixel_shuffle: inp must be (..., C * {r * r}, H, W) for upscale_factor={r}, "
                         f"got shape {x.shape}")
    lead, (c, h, w) = x.shape[:-3], x.shape[-3:]
    y = reshape(x, (int(np.prod(lead)), c // (r * r), r, r, h, w))
    y = transpose(y, (0, 1, 4, 2, 5, 3))       # (n, c, h, r, w, r)
    return reshape(y, lead + (c // (r * r), h * r, w * r))
