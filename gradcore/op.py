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

from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from . import _core, _op_intern


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


class OpDefinitionError(TypeError):
    """An op instance that cannot be a value: an attribute that is not
    hashable, or an attempt to change an op after construction."""


_INTERN_LIMIT = 4096         # ops kept per class by the intern table (then it starts over)


def _construct(cls, args, kwargs):
    """Build an op on an intern-table miss (``Cls(*args)`` whose arguments
    were not seen before; the hit is a C lookup in ``_op_intern.OpMeta``):
    run the class's own ``__init__`` (whatever it stores becomes the op's
    attributes), seal the instance (hash and equality over every attribute,
    no later changes) and return the one instance equal to it, remembered
    so that the next call with the same arguments finds it at once."""
    inst = type.__call__(cls, *args, **kwargs)
    if isinstance(inst, Op):
        if not inst.__dict__.get("_sealed", False):
            inst._seal()
            object.__setattr__(inst, "_sealed", True)
        if type(inst) is cls and not inst.__dict__.get("_no_intern", False):
            table = cls.__dict__.get("_interned")
            if table is None or len(table) > _INTERN_LIMIT:
                table = {}         # bounded: equal ops stay equal, just not identical
                type.__setattr__(cls, "_interned", table)
            inst = table.setdefault(inst._key, inst)
            _op_intern.remember(cls, args, kwargs, inst, _INTERN_LIMIT)
    return inst


_op_intern.install(_construct)


def clear_interned() -> None:
    """Forget every interned op (and so the caches they hold: kernels,
    backward graphs, infer verdicts); equal ops built afterwards are new
    instances. The intern tables are bounded anyway; this is for tests and
    long-running processes that want the memory back now.

    Example::

        >>> op = Reduce("sum", 1); clear_interned(); Reduce("sum", 1) is op
        False
    """
    _op_intern.forget_all()
    todo = [Op]
    while todo:
        cls = todo.pop()
        table = cls.__dict__.get("_interned")
        if table:
            table.clear()
        todo.extend(cls.__subclasses__())


class Op(_core.OpBase, metaclass=_op_intern.OpMeta):
    """Base class of all ops. Subclasses set ``name``; whatever the
    constructor stores on ``self`` is the op's attributes (its parameters):
    equality and hashing follow them, and the op is immutable afterwards.
    Names starting with ``_``, and per-instance overrides of protocol members
    the class defines (``cpu``, ``vjp``, ``nin``...), are derived values,
    not parameters. A class may also list its attributes in ``attrs``.

    Example::

        class Scale(Op):
            name = "scale"
            def __init__(self, factor=1.0):
                self.factor = float(factor)     # an attribute: Scale(2.0) != Scale(3.0)
            def infer(self, x): return (x,)
            def cpu(self, x): return x * self.factor
            def vjp(self, inputs, outputs, grads): return (grads[0] * self.factor,)

        >>> Scale(2.0) is Scale(2.0)            # equal ops are one instance
        True
        >>> Scale(2.0)(x)                        # an op is callable: apply(op, x)[0]
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

    def _seal(self):
        """Compute the key (class and attributes) that hash and equality use.
        Called by the constructor machinery after ``__init__``; calling it at
        the end of ``__init__`` as older ops do is harmless."""
        d = self.__dict__
        cls = type(self)
        declared = tuple(cls.attrs)
        found = tuple(k for k in d if k not in declared and not k.startswith("_") and k != "attrs"
                      and not hasattr(cls, k))
        names = declared + found
        if names != declared:
            object.__setattr__(self, "attrs", names)
        missing = [a for a in names if a not in d and not hasattr(cls, a)]
        if missing:
            raise OpDefinitionError(
                f"{cls.__name__}: attribute(s) {', '.join(missing)} listed in attrs were never set; "
                f"store them in __init__ (self.{missing[0]} = ...)")
        key = (cls,) + tuple(_freeze(getattr(self, a)) for a in names)
        try:
            h = hash(key)
        except TypeError:
            bad = [a for a in names if not _hashable(_freeze(getattr(self, a)))]
            raise OpDefinitionError(
                f"{cls.__name__}: op attribute(s) {', '.join(bad)} are not hashable "
                f"({', '.join(type(getattr(self, a)).__name__ for a in bad)}); an op's attributes are "
                f"values (numbers, strings, tuples): store a tuple, and pass arrays as inputs") from None
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", h)

    def __setattr__(self, name, value):
        if self.__dict__.get("_sealed", False):
            raise OpDefinitionError(
                f"{self._name()}: ops are immutable after construction (setting {name!r}); "
                f"construct a new op instead, e.g. {type(self).__name__}(...)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if self.__dict__.get("_sealed", False):
            raise OpDefinitionError(f"{self._name()}: ops are immutable after construction "
                                    f"(deleting {name!r})")
        object.__delattr__(self, name)

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


def function(op_class: type, name: Optional[str] = None) -> Callable:
    """Publish a functional wrapper for an op class, in one line::

        softsign = gradcore.op.function(Softsign)
        y = softsign(x)                   # apply(Softsign(), x)[0]
        y = rms_norm(x, eps=1e-6)         # keywords are the op's constructor arguments

    The wrapper returns the output itself for a one-output op, else the tuple
    of outputs. Equal ops are interned, so every call reuses one op instance
    and its caches (kernel, backward graph, infer verdict)."""
    fname = name or getattr(op_class, "name", "") or op_class.__name__
    try:
        default = op_class()        # the instance for calls without parameters
    except TypeError:
        default = None              # the constructor needs arguments

    def op_function(*tensors, **params):
        if params or default is None:
            # op_class(**params) is interned: the same instance for equal params
            return op_class(**params)(*tensors)
        return default(*tensors)

    op_function.__name__ = op_function.__qualname__ = fname
    op_function.__doc__ = _wrapper_doc(op_class)
    op_function.__wrapped__ = op_class
    return op_function


def _wrapper_doc(op_class) -> str:
    return f"Functional form of the op {op_class.__name__}.\n\n{op_class.__doc__ or ''}"


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def _rebuild_op(cls, attrs):
    try:
        # through the constructor: derived values (kernels, caches) are rebuilt too
        op = cls(**attrs)
        if all(getattr(op, k, _MISSING) == v for k, v in attrs.items()):
            return op
    except Exception:
        pass
    op = cls.__new__(cls)
    for k, v in attrs.items():
        object.__setattr__(op, k, v)
    op._seal()
    object.__setattr__(op, "_sealed", True)
    return op


_MISSING = object()


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
        if _composite_tracer is None:
            raise RuntimeError(f"{self._name()}: shape inference traces decompose(), and the tracer "
                               f"(gradcore.graph) is not loaded: import gradcore")
        return _composite_tracer(self, descs)

    def cpu(self, *arrays):
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


# Composite.infer traces decompose() with gradcore.graph, which sits above
# this module: it hands its tracer over when it loads
_composite_tracer = None


def install_composite_tracer(tracer) -> None:
    """Called by ``gradcore.graph`` at import: ``tracer(op, descs)`` gives a
    ``Composite`` op's output descriptors by tracing its ``decompose``.

    Example::

        >>> install_composite_tracer(gradcore.graph.infer_by_tracing)
    """
    global _composite_tracer
    _composite_tracer = tracer


# ---- the forward path consults infer (see _core._guard_infer: once per op and input descriptors)
def _has_infer(op) -> bool:
    """Whether ``apply`` runs ``op.infer`` before the kernel: when the class
    defines its own (not Op's placeholder nor Composite's, whose decomposition
    validates itself op by op)."""
    fn = getattr(type(op), "infer", None)
    return fn is not None and fn is not Op.infer and fn is not Composite.infer


def _infer_check(op, args) -> None:
    """``op.infer`` on the descriptors of ``args``: raises the op's own error
    for inputs it rejects."""
    op.infer(*[TensorDesc(t.shape, t.dtype, str(t.device)) for t in args])


_core._install_hooks(infer_check=_infer_check, has_infer=_has_infer)
