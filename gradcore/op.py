"""What an op is: the base class every op derives from, and TensorDesc.

An op is a hashable value (its kind plus attributes) with
  - ``infer(*descs)``: output TensorDescs; rejects bad input with the op's
    name and the shapes before any kernel runs (shapes may be None while
    backward graphs are traced);
  - kernels: ``cpu(*arrays)`` (NumPy) and optionally ``cuda_source``;
  - a gradient path: ``vjp(inputs, outputs, grads)`` or ``decompose(*inputs)``
    (both traced into a backward graph), or ``_grad_rule`` (run directly).

Example, a complete differentiable op::

    class Cube(Op):
        name = "cube"
        def infer(self, x):
            return (x,)
        def cpu(self, x):
            return x * x * x
        def vjp(self, inputs, outputs, grads):
            (x,), (g,) = inputs, grads
            return (g * 3 * x * x,)
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import _core


class TensorDesc:
    """Shape (None when unknown), dtype and device of a tensor; what the
    backward-graph tracer works with instead of values.

    Example::

        >>> TensorDesc((2, 3), "float32", "cpu").ndim
        2
    """

    __slots__ = ("shape", "dtype", "device")

    def __init__(self, shape: Optional[Sequence[int]], dtype: Any = "float32", device: str = "cpu"):
        self.shape = None if shape is None else tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.device = str(device)

    @property
    def ndim(self) -> Optional[int]:
        return None if self.shape is None else len(self.shape)

    def __eq__(self, other):
        return (isinstance(other, TensorDesc) and self.shape == other.shape
                and self.dtype == other.dtype and self.device == other.device)

    def __hash__(self):
        return hash((self.shape, self.dtype, self.device))

    def __repr__(self):
        return f"TensorDesc(shape={self.shape}, dtype={self.dtype}, device={self.device})"


class OpError(ValueError, RuntimeError):
    """Bad input to an op: the message names the op and the shapes. A
    ValueError, and a RuntimeError as MegEngine raises for the same."""


class IndexOpError(OpError, IndexError):
    """An index out of range (or not an integer): one exception type for
    basic indexing, advanced indexing, index assignment, ``gather``,
    ``scatter`` and ``indexing_one_hot``; an IndexError, as NumPy raises,
    and an OpError naming the op."""


def _fmt(desc) -> str:
    return "?" if desc.shape is None else str(desc.shape)


class Op(_core.OpBase):
    """Base class of all ops. Subclasses set ``name`` and list their
    attribute names in ``attrs``; equality and hashing follow them.

    Example::

        class Scale(Op):
            name = "scale"
            attrs = ("factor",)
            def __init__(self, factor): self.factor = float(factor); self._seal()
    """

    name: str = ""
    attrs: Tuple[str, ...] = ()
    # indices of inputs whose value is never read, only their shape/dtype
    shape_only_inputs: Tuple[int, ...] = ()
    # the backward graph returns grads in the broadcast output shape and the
    # core reduces them to each input's shape
    reduce_broadcast: bool = False
    # the package the op was registered from (set by the registry)
    dist: str = ""

    def __init__(self, **attrs):
        for k, v in attrs.items():
            setattr(self, k, v)
        self._seal()

    def _seal(self):
        key = (type(self),) + tuple(_freeze(getattr(self, a)) for a in self.attrs)
        self._key = key
        self._hash = hash(key)

    def _name(self) -> str:
        if not self.attrs:
            return self.name or type(self).__name__
        inner = ", ".join(f"{a}={getattr(self, a)!r}" for a in self.attrs)
        return f"{self.name or type(self).__name__}({inner})"

    def __repr__(self):
        return self._name()

    def __eq__(self, other):
        return self is other or (isinstance(other, Op) and self._key == other._key)

    def __hash__(self):
        return self._hash

    def __reduce__(self):
        return (_rebuild_op, (type(self), {a: getattr(self, a) for a in self.attrs}))

    # ---- protocol helpers for subclasses
    def error(self, message: str, *descs) -> OpError:
        shapes = ", ".join(_fmt(d) for d in descs)
        suffix = f" (input shapes: {shapes})" if descs else ""
        return OpError(f"{self._name()}: {message}{suffix}")

    def infer(self, *descs: TensorDesc) -> Tuple[TensorDesc, ...]:
        raise NotImplementedError(f"{self._name()} has no shape inference")


def _rebuild_op(cls, attrs):
    op = cls.__new__(cls)
    for k, v in attrs.items():
        setattr(op, k, v)
    op._seal()
    return op


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.dtype):
        return v.str
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    return v


shape_carrier = _core.shape_carrier
broadcast_view = _core.broadcast_view


def interned(cls):
    """A cached constructor for an op class: equal attributes give the same
    instance, so per-op caches (kernel, backward graph) are hit on every call.

    Example::

        >>> reduce_op = interned(Reduce)
        >>> reduce_op("sum", 1, False) is reduce_op("sum", 1, False)
        True
    """
    import functools
    return functools.lru_cache(maxsize=1024)(cls)


class Composite(Op):
    """An op declared only by ``decompose(*inputs)`` in terms of other ops:
    its shape inference, CPU forward and backward graph are all derived from
    the decomposition.

    Example::

        class Softplus(Composite):
            name = "softplus"
            def decompose(self, x):
                return F.log(F.exp(x) + 1)
    """

    def infer(self, *descs):
        from .graph import Trace, SymbolicTensor
        trace = Trace()
        ins = [trace.new_value(d) for d in descs]
        res = self.decompose(*ins)
        res = (res,) if isinstance(res, SymbolicTensor) else tuple(res)
        return tuple(r.desc for r in res)

    def cpu(self, *arrays):
        from . import _core
        _core._no_record_enter()
        try:
            res = self.decompose(*[_core.wrap_array(a) for a in arrays])
        finally:
            _core._no_record_exit()
        if isinstance(res, _core.Tensor):
            return res._data
        return tuple(r._data for r in res)

    def cuda(self, be, *arrays):
        # the decomposition's ops run where the arrays are (a wrapped
        # DeviceArray is a cuda tensor)
        return self.cpu(*arrays)
