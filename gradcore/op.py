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

import inspect
import threading
import typing
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
        self.shape = None if shape is None else tuple(map(int, shape))
        self.dtype = np.dtype(dtype)
        # a str subclass (devices.LogicalDevice) is kept: it prints its logical name
        self.device = device if isinstance(device, str) else str(device)

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


class ArgumentError(ValueError, AssertionError):
    """A bad argument to a function, module or optimizer (a negative
    learning rate, an unknown mode, a probability outside [0, 1)): a
    ValueError, and the AssertionError MegEngine's ``assert`` checks raise
    for the same."""


class ArgumentTypeError(TypeError, AssertionError):
    """An argument of the wrong kind (an array where Tensors are expected):
    a TypeError, and the AssertionError MegEngine's checks raise."""


class IndexOpError(OpError, IndexError):
    """An index out of range (or not an integer): one exception type for
    basic indexing, advanced indexing, index assignment, ``gather``,
    ``scatter`` and ``indexing_one_hot``; an IndexError, as NumPy raises,
    and an OpError naming the op."""


def op_label(op) -> str:
    """How messages name an op: its ``_name()`` (the class's name with the
    attributes), else its ``name``, else its class's name (an op class, a
    ``Function``, anything op-like).

    Example::

        >>> op_label(Reduce("sum", 1))
        "Reduce(mode='sum', axis=(1,), keepdims=False)"
    """
    try:
        return op._name()
    except Exception:
        return getattr(op, "name", "") or type(op).__name__


def name_the_op(op, exc: BaseException, where: str) -> None:
    """Put ``op``'s name in front of an error raised inside its ``where``
    (its ``vjp``, its decomposition), unless the message names it already:
    an error from an op or function used in there (``Elemwise(mul): shapes
    cannot be broadcast``) must still say whose code was running. The
    exception keeps its type and traceback (the caller re-raises it).

    Example::

        >>> try: op.vjp(ins, outs, grads)
        ... except Exception as exc: name_the_op(op, exc, "vjp"); raise
    """
    label, short = op_label(op), getattr(op, "name", "") or type(op).__name__
    text = str(exc)
    if short in text or label in text:
        return
    if exc.args and isinstance(exc.args[0], str):
        hint = ""
        if where == "vjp" and isinstance(exc, TypeError) and "NoneType" in text:
            # the usual cause: a shape read while tracing, often inside a
            # helper (F.repeat along an axis reads the rank), far from the vjp
            hint = (" (while a vjp is traced, shapes and ndim are None: code that reads them, the vjp's "
                    "own or a function it calls such as F.repeat or F.tile, cannot run there; write the "
                    "gradient by broadcasting (F.zeros_like(x) + ...) or with gradcore.ops.ReshapeLike)")
        exc.args = (f"{label}: in its {where}: {exc.args[0]}{hint}",) + exc.args[1:]
    else:
        exc.add_note(f"(raised in the {where} of {label})")


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
    so that the next call with the same arguments finds it at once. This
    and ``_op_intern`` are the one interning layer."""
    inst = type.__call__(cls, *args, **kwargs)
    if isinstance(inst, Op):
        _seal(inst)
        if type(inst) is cls:
            table = cls.__dict__.get("_interned")
            if table is None or len(table) > _INTERN_LIMIT:
                table = {}         # bounded: equal ops stay equal, just not identical
                type.__setattr__(cls, "_interned", table)
            found = table.setdefault(inst._key, inst)
            if found is not inst:
                _check_same_hidden_state(found, inst)
            inst = found
            _op_intern.remember(cls, args, kwargs, inst, _INTERN_LIMIT)
    return inst


_SEAL_KEYS = ("_key", "_hash", "_sealed", "attrs")
_PLAIN = (int, float, complex, str, bytes, bool, tuple, frozenset, type(None), np.generic)


def _check_same_hidden_state(found, inst) -> None:
    """``inst`` was built with other arguments than ``found`` yet has the
    same key: fine when everything else it stores is equal too (``MyPow(3)``
    and ``MyPow(3.0)``); an error naming the op when a plain value differs
    (``self._k = k``, or a parameter named like a class attribute such as
    ``dist`` or ``name``): handing back ``found`` would silently run the op
    with the other value, and share its caches."""
    a, b = vars(found), vars(inst)
    keyed = set(found.attrs)     # compared by the key already (3 and 3.0 alike)
    for k in sorted(set(a) | set(b)):
        if k in _SEAL_KEYS or k in keyed or k.startswith("__"):
            continue
        va, vb = a.get(k), b.get(k)
        if va is vb or not (isinstance(va, _PLAIN) and isinstance(vb, _PLAIN)):
            continue             # objects (kernels, tables): not comparable by value here
        try:
            same = type(va) is type(vb) and bool(va == vb)
        except Exception:
            continue
        if not same:
            cls = type(inst)
            if k.startswith("_"):
                why, fix = "a name starting with '_' is not a parameter", f"`self.{k.lstrip('_')} = ...`"
            else:
                why, fix = f"{k!r} is a member of the op class, not a parameter", f"another name (`self.{k}_ = ...`)"
            raise OpDefinitionError(
                f"{_class_label(cls)}: {k}={vb!r} is ignored by the op's equality ({why}), so the op "
                f"equals {found!r} built with {k}={va!r}, and would run as that one, sharing its caches; "
                f"store the parameter under {fix} in __init__")


def _class_label(cls) -> str:
    """An op class as its errors name it: the op's ``name`` (what ``gradcore ops``,
    ``check_op`` and every other message say), and the Python class when it
    differs. Example: ``_class_label(MyConv)`` -> ``'Convolution2 (class MyConv)'``."""
    name = getattr(cls, "name", "") or ""
    return cls.__name__ if not isinstance(name, str) or name in ("", cls.__name__) \
        else f"{name} (class {cls.__name__})"


def _seal(inst) -> None:
    """Compute the key (class and attributes) that hash and equality use,
    and make the op immutable. Run once per instance by the constructor
    machinery (``_construct``) after ``__init__``."""
    d = inst.__dict__
    if d.get("_sealed", False):
        return
    cls = type(inst)
    declared = tuple(cls.attrs)
    found = tuple(k for k in d if k not in declared and not k.startswith("_") and k != "attrs"
                  and not hasattr(cls, k))
    names = declared + found
    if names != declared:
        object.__setattr__(inst, "attrs", names)
    missing = [a for a in names if a not in d and not hasattr(cls, a)]
    if missing:
        raise OpDefinitionError(
            f"{_class_label(cls)}: attribute(s) {', '.join(missing)} listed in attrs were never set; "
            f"store them in __init__ (self.{missing[0]} = ...)")
    for a in names:
        # a list attribute becomes the tuple it is hashed as: left a list, a later
        # `op.coeffs[0] = ...` would change the interned op's forward while its cached
        # backward graphs and kernels keep the old value (a silently wrong gradient)
        if isinstance(d.get(a), list):
            object.__setattr__(inst, a, _freeze(d[a]))
    key = (cls,) + tuple(_freeze(getattr(inst, a)) for a in names)
    try:
        h = hash(key)
    except TypeError:
        bad = [a for a in names if not _hashable(_freeze(getattr(inst, a)))]
        raise OpDefinitionError(
            f"{_class_label(cls)}: op attribute(s) {', '.join(bad)} are not hashable "
            f"({', '.join(type(getattr(inst, a)).__name__ for a in bad)}); an op's attributes are "
            f"values (numbers, strings, tuples): store a tuple, and pass arrays as inputs") from None
    object.__setattr__(inst, "_key", key)
    object.__setattr__(inst, "_hash", h)
    object.__setattr__(inst, "_sealed", True)


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


# ---------------------------------------------------------------- the op description
# The one vocabulary for gradient paths, in the order the core tries them
# (SPEC "The three gradient paths"): the op's own ``_grad_rule``; a rule
# registered for its type; a backward graph traced from its ``vjp`` or
# derived from its ``decompose``.
GRAD_PATHS = ("_grad_rule", "registered rule", "vjp", "decompose")


class OpDescription:
    """Every fact about an op class, decided once when the class is defined
    (the op metaclass describes each class; ``describe(op)`` reads it). The
    core, the backward-graph builder, the registry, ``check_op``, the CLI
    and ``visualize`` read it; none works these facts out again.

    - ``grad_path``: one of ``GRAD_PATHS`` or None (a rule registered with
      ``register_grad_rule`` counts from then on); ``grad_rule``: the class
      has its own; ``traced``: "vjp", "decompose" or None, what a backward
      graph is built from; ``forward_by_rule``: no cpu kernel, the rule runs it;
    - ``devices``: declared (``devices = (...)``) or those with a kernel;
      ``kernels``: device -> how it runs there: "cpu", "launcher" (its
      ``cuda(self, be, *arrays)``), "default launch" (its ``cuda_source``
      given the inputs, the outputs and ``long long n``), "decompose" or
      "_grad_rule";
    - ``params``: ``(name, default)`` per constructor parameter;
      ``choices()``: the values a parameter annotated ``typing.Literal[...]``
      may take (what ``check_op`` tries besides the default); ``arity``:
      ``(attribute, (min, max))`` inputs of the forward, or None;
      ``has_infer``: the forward consults the class's own ``infer``;
      ``reduce_broadcast``: a backward's gradient in the inputs' broadcast
      shape is summed down centrally (default True);
      ``check``: ``domain``, ``check_shapes``, ``check_params``,
      ``check_gradient``, ``max_grad_order`` (1: its backward has no gradient
      of its own), ``examples`` as declared;
    - ``misspelt``: ``(defined, meant)`` pairs, a member whose name is one
      typo away from a protocol member the class lacks (``vpj`` for ``vjp``):
      registration and ``check_op`` refuse the class with the pair named.

    Example::

        >>> describe(Elemwise).grad_path, describe(Elemwise).devices
        ('vjp', ('cpu', 'cuda'))
    """

    __slots__ = ("cls", "name", "grad_rule", "traced", "devices", "kernels", "params", "arity",
                 "has_infer", "check", "forward_by_rule", "elementwise", "reduce_broadcast", "misspelt",
                 "_choices")

    def __init__(self, cls):
        self.cls = cls
        self.name = getattr(cls, "name", "") or cls.__name__
        has = lambda a: getattr(cls, a, None) is not None
        self.grad_rule = has("_grad_rule")
        self.traced = "vjp" if has("vjp") else "decompose" if has("decompose") else None
        kernels = {}
        if has("cpu"):
            kernels["cpu"] = "decompose" if getattr(cls, "cpu") is _decomposed_cpu else "cpu"
        elif self.grad_rule:
            kernels["cpu"] = "_grad_rule"
        if has("cuda"):
            kernels["cuda"] = "decompose" if getattr(cls, "cuda") is _decomposed_cuda else "launcher"
        elif has("cuda_source"):
            kernels["cuda"] = "default launch"
        elif self.grad_rule and not has("cpu"):
            # a forward written with gradcore ops runs on any device
            kernels["cuda"] = "_grad_rule"
        self.kernels = kernels
        # an op whose forward is its _grad_rule's (no cpu kernel of its own)
        self.forward_by_rule = self.grad_rule and not has("cpu")
        declared = getattr(cls, "devices", None)
        if declared is not None and not isinstance(declared, property):
            self.devices = (declared,) if isinstance(declared, str) else tuple(declared)
        else:
            self.devices = tuple(d for d in ("cpu", "cuda") if d in kernels)
        try:
            sig = list(inspect.signature(cls.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            sig = []
        self.params = tuple((p.name, p.default) for p in sig if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        self.arity = _forward_arity(cls)
        infer = getattr(cls, "infer", None)
        self.has_infer = infer is not None and infer is not _base_infer and infer is not _decomposed_infer
        # an op of the elementwise row table: each instance's ``row`` (what
        # the fused CUDA backward kernels are written from)
        self.elementwise = hasattr(cls, "row")
        # gradients may come back in the inputs' broadcast shape (summed down centrally)
        self.reduce_broadcast = bool(getattr(cls, "reduce_broadcast", True))
        self.check = {a: getattr(cls, a, None) for a in
                      ("domain", "check_shapes", "check_params", "check_gradient", "max_grad_order",
                       "examples")}
        self.misspelt = _misspelt_members(cls, self)
        self._choices = None

    def choices(self) -> dict:
        """``{parameter: (values...)}`` for the constructor's parameters
        annotated ``typing.Literal[...]`` (read on first use: resolving the
        annotations costs more than the rest of the description).

        Example::

            >>> class Pad(Op):
            ...     def __init__(self, mode: Literal["zero", "edge"] = "zero"): self.mode = mode
            >>> describe(Pad).choices()
            {'mode': ('zero', 'edge')}
        """
        if self._choices is None:
            found = {}
            try:
                hints = typing.get_type_hints(self.cls.__init__)
            except Exception:           # an annotation that does not resolve: no choices read
                hints = {}
            for name, _ in self.params:
                hint = hints.get(name)
                if typing.get_origin(hint) is typing.Literal:
                    found[name] = typing.get_args(hint)
            self._choices = found
        return self._choices

    @property
    def grad_path(self) -> Optional[str]:
        if self.grad_rule:
            return "_grad_rule"
        if _core.registered_grad_rule(self.cls) is not None:
            return "registered rule"
        return self.traced

    def row(self, op):
        """The elementwise row (``gradcore.ops.elemwise.Row``: its CUDA
        expression, dtypes...) of ``op``, an instance of the described class;
        None for an op outside the row table."""
        return op.row if self.elementwise else None

    def __repr__(self):
        return (f"OpDescription({self.name}: grad path {self.grad_path}, devices {self.devices}, "
                f"kernels {self.kernels}, params {[p for p, _ in self.params]})")


# protocol members an author defines, by what their absence leaves undone
_GRADIENT_MEMBERS = ("vjp", "decompose", "_grad_rule")
_FORWARD_MEMBERS = ("infer", "cpu", "cuda", "cuda_source")
_CHECK_MEMBERS = ("examples", "check_params", "check_shapes", "check_gradient", "max_grad_order", "domain")


def _one_typo_apart(a: str, b: str) -> bool:
    """a and b differ by at most one edit (insert, delete, substitute, swap
    two neighbours), ignoring case and leading underscores. (Run for every
    member of every op class at import: a linear scan, not an edit-distance
    table, which cost the import 76 ms.)"""
    a, b = a.lower().lstrip("_"), b.lower().lstrip("_")
    if abs(len(a) - len(b)) > 1:
        return False
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    if len(a) == len(b):
        return (a[i + 1:] == b[i + 1:]                                        # equal, or one substitution
                or a[i:i + 2] == b[i:i + 2][::-1] and a[i + 2:] == b[i + 2:])  # two neighbours swapped
    return a[i + 1:] == b[i:] if len(a) > len(b) else a[i:] == b[i + 1:]


def _misspelt_members(cls, desc) -> tuple:
    """``(defined, meant)`` for members of ``cls`` (its own, not inherited)
    that look like a typo of a protocol member the class does not have: an
    op that silently lost its gradient, kernel or check settings."""
    missing = [m for m in _FORWARD_MEMBERS + _CHECK_MEMBERS if getattr(cls, m, None) is None]
    if desc.grad_rule is False and desc.traced is None:
        missing += list(_GRADIENT_MEMBERS)
    found = []
    for name in cls.__dict__:
        if name.startswith("__") or name in _GRADIENT_MEMBERS + _FORWARD_MEMBERS + _CHECK_MEMBERS:
            continue
        # one edit away; a private helper (_cpu, _infer) is only taken for _grad_rule
        candidates = [m for m in missing if m.startswith("_")] if name.startswith("_") else missing
        for meant in candidates:
            if _one_typo_apart(name, meant):
                found.append((name, meant))
                break
    return tuple(found)


def positional_arity(fn, drop_self: bool = True):
    """(min, max) positional arguments ``fn`` accepts (max None for
    ``*args``, -1 when a keyword-only argument is required); None when the
    signature cannot be read (a C function, say).

    Example::

        >>> positional_arity(lambda self, x, y=1: 0)
        (1, 2)
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if drop_self and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    lo, hi = 0, 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            hi = None
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if hi is not None:
                hi += 1
            if p.default is p.empty:
                lo += 1
        elif p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            return (lo, -1)      # a required keyword-only argument: never callable positionally
    return (lo, hi)


def _forward_arity(cls):
    """(attribute, (min, max)) of the first of infer, cpu, decompose that
    states how many inputs the forward takes; None when none does."""
    for attr in ("infer", "cpu", "decompose"):
        fn = getattr(cls, attr, None)
        if fn is None or fn in (_base_infer, _decomposed_infer, _decomposed_cpu):
            continue
        ar = positional_arity(fn)
        if ar is not None and ar[1] is not None and ar[1] != -1:
            return (attr, ar)
    return None


def describe(op) -> OpDescription:
    """The ``OpDescription`` of an op or op class (computed once per class;
    classes that are not ``Op``s, such as ``Function``, are described on
    first use).

    Example::

        >>> describe(Elemwise("mul")).kernels
        {'cpu': 'cpu', 'cuda': 'launcher'}
    """
    cls = op if isinstance(op, type) else type(op)
    d = cls.__dict__.get("_desc")
    if d is None:
        d = _describe(cls)
    return d


def _describe(cls) -> OpDescription:
    """Called by the op metaclass for every class it creates: give an op
    declared by ``decompose`` alone its derived forward, then describe it."""
    if getattr(cls, "decompose", None) is not None:
        if getattr(cls, "cpu", None) is None:
            cls.cpu = _decomposed_cpu
        if getattr(cls, "cuda", None) is None and getattr(cls, "cuda_source", None) is None:
            cls.cuda = _decomposed_cuda
        if getattr(cls, "infer", None) in (None, _base_infer):
            cls.infer = _decomposed_infer
    d = OpDescription(cls)
    try:
        cls._desc = d
    except TypeError:          # a class that takes no attributes (a builtin type)
        pass
    return d


class _Decomposing(threading.local):
    def __init__(self):
        self.active = {}      # op -> the input descs its decompose is being traced on


_decomposing = _Decomposing()


def _enter_decomposition(op, items):
    """Note that ``op``'s decomposition is traced on ``items`` (descs);
    returns what to restore after. A decompose that applies the op itself
    to inputs of the same shapes and dtypes would recurse until Python's
    stack runs out: a TypeError naming the op instead. (The trace runs
    before any forward, from infer, so the forward needs no check of its
    own.)"""
    active = _decomposing.active
    outer = active.get(op)
    if outer is not None and len(outer) == len(items) and all(
            o.shape == i.shape and o.dtype == i.dtype for o, i in zip(outer, items)):
        label = op._name()
        raise TypeError(f"{label}: its decompose applies {label} itself (to inputs of the same shapes and "
                        f"dtypes), a recursion that never ends; write the decomposition with other ops")
    active[op] = items
    return outer


def _leave_decomposition(op, outer) -> None:
    if outer is None:
        _decomposing.active.pop(op, None)
    else:
        _decomposing.active[op] = outer


def _decomposed_cpu(self, *arrays):
    """The forward of an op declared by ``decompose``: its decomposition run
    on the arrays (nothing recorded; on cuda, on device arrays)."""
    _core._no_record_enter()
    try:
        res = self.decompose(*[_core.wrap_array(a) for a in arrays])
    except RecursionError:
        # caught by the innermost call: one clear error instead of Python's
        # stack overflow (the trace, from infer, checks this exactly)
        raise TypeError(f"{self._name()}: its decompose recursed without end; does it apply "
                        f"{self._name()} itself? write the decomposition with other ops") from None
    finally:
        _core._no_record_exit()
    if isinstance(res, _core.Tensor):
        return res._data
    return tuple(r._data for r in checked_decompose_result(self, res, _core.Tensor))


def checked_decompose_result(op, res, tensor_type) -> tuple:
    """What ``op.decompose`` returned, as a tuple of ``tensor_type``, one per
    output (a single one made a 1-tuple); anything else (None, a number, a
    NumPy array, no output) is a TypeError naming the op and saying what to
    return.

    Example::

        >>> checked_decompose_result(op, x * 2, Tensor)      # (x * 2,)
    """
    if isinstance(res, tensor_type):
        return (res,)
    bad = None
    if isinstance(res, (tuple, list)):
        bad = next(((i, r) for i, r in enumerate(res) if not isinstance(r, tensor_type)), None)
        if bad is None and res:
            return tuple(res)
    what = (f"{type(bad[1]).__name__} as output {bad[0]}" if bad is not None else
            "no output" if isinstance(res, (tuple, list)) else type(res).__name__)
    raise TypeError(f"{op._name()}: decompose must return its outputs, a Tensor or a tuple of Tensors "
                    f"computed with gradcore ops from its inputs, got {what}")


def _decomposed_cuda(self, be, *arrays):
    # the decomposition's ops run where the arrays are (a wrapped
    # DeviceArray is a cuda tensor)
    return _decomposed_cpu(self, *arrays)


def _decomposed_infer(self, *descs):
    if _composite_tracer is None:
        raise RuntimeError(f"{self._name()}: shape inference traces decompose(), and the tracer "
                           f"(gradcore.graph) is not loaded: import gradcore")
    try:
        outer = _enter_decomposition(self, descs)
        try:
            return _composite_tracer(self, descs)
        finally:
            _leave_decomposition(self, outer)
    except Exception as exc:
        name_the_op(self, exc, "decomposition")
        raise


def _base_infer(self, *descs: "TensorDesc") -> Tuple["TensorDesc", ...]:
    raise NotImplementedError(f"{self._name()} has no shape inference")


_op_intern.install(_construct, _describe)


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
    # a backward may return an input's gradient in the inputs' broadcast
    # shape: the core sums it down to the input's shape (and names the op
    # when it cannot). An op whose gradients always have their inputs' shapes
    # may say False: it saves a shape comparison per call
    reduce_broadcast: bool = True
    # the package the op was registered from (set by the registry)
    dist: str = ""

    def __init__(self, **attrs):
        for k, v in attrs.items():
            setattr(self, k, v)

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

    infer = _base_infer

    def infer_arrays(self, *arrays, device: str = "cuda") -> tuple:
        """``infer`` on the descriptors of ``arrays`` (anything with ``shape``
        and ``dtype``: device arrays, NumPy arrays), remembered per op for
        their shapes and dtypes: a launcher learns its outputs' shapes
        without checking the same inputs again on every call (the checks
        ran once; bad inputs still raise each time, since only accepted
        ones are remembered).

        Example::

            def cuda(self, be, x, w):
                (out,) = self.infer_arrays(x, w)
                y = be.empty(out.shape, out.dtype)
        """
        key = (device,) + tuple([(a.shape, a.dtype) for a in arrays])
        memo = self.__dict__.get("_infer_memo")     # ops are immutable: a cache beside the attributes
        if memo is None:
            memo = self.__dict__["_infer_memo"] = {}
        found = memo.get(key)
        if found is None:
            found = tuple(self.infer(*[TensorDesc(a.shape, a.dtype, device) for a in arrays]))
            if len(memo) >= 256:
                memo.clear()
            memo[key] = found
        return found


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


def needs_grad(x) -> bool:
    """Inside a ``vjp`` being traced into a backward graph: False when ``x``
    is an input of the op whose backward is built and that backward returns
    no gradient for it (it does not require one), True otherwise. A vjp may
    leave out work that feeds only such a gradient, where dead-code removal
    cannot (one op computing several gradients at once). The graph is
    cached per requires-grad mask, so the answer holds for every call that
    uses it.

    Example::

        def vjp(self, inputs, outputs, grads):
            (x, w, b), (g,) = inputs, grads
            if not needs_grad(w):            # the weight is frozen: no weight gradient op
                return [dx(g, w), None, bias_grad(g, b)]
            ...
    """
    no_grad = getattr(getattr(x, "trace", None), "no_grad", None)
    return not no_grad or x.vid not in no_grad


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
    except Exception as exc:
        refused = exc
    else:
        refused = None
    _check_saved_parameters(cls, attrs, refused)
    op = cls.__new__(cls)
    for k, v in attrs.items():
        object.__setattr__(op, k, v)
    _seal(op)
    return op


_MISSING = object()


class SavedOpMismatchError(TypeError):
    """A saved op whose parameters are not those of the installed class
    (``gradcore.load`` of a file written with another version of its
    package); the message names the op and both parameter lists."""


def _check_saved_parameters(cls, attrs, refused) -> None:
    """An op saved by another version of its class (a plugin upgraded
    since) would be rebuilt with parameters the class no longer reads, and
    fail later, at its first call, with an AttributeError naming neither the
    file nor the change: a TypeError naming the op and both parameter lists
    instead. Known when the class builds with its defaults; else the saved
    attributes are taken as they are."""
    try:
        now = tuple(cls().attrs)
    except Exception:
        return
    if set(now) == set(attrs):
        return
    label = getattr(cls, "name", "") or cls.__name__
    saved = ", ".join(f"{k}={v!r}" for k, v in attrs.items())
    why = f" (its constructor refuses them: {type(refused).__name__}: {refused})" if refused is not None else ""
    raise SavedOpMismatchError(f"{label}: a saved {label}({saved}) cannot be rebuilt: the installed class "
                    f"{cls.__module__}.{cls.__qualname__} has the parameters ({', '.join(now)}){why}; the file "
                    f"was saved with another version of the op's package: install that version, or save "
                    f"state_dicts (tensors only), which do not hold ops")


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.dtype):
        return v.str
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    if isinstance(v, str) and type(v) is not str:
        # a str subclass (devices.LogicalDevice "cpu1:0" equals "cpu"): keyed
        # by what it prints, so two logical devices are two ops
        return (type(v).__name__, str(v))
    return v


shape_carrier = _core.shape_carrier
broadcast_view = _core.broadcast_view


class Composite(Op):
    """An op declared only by ``decompose(*inputs)`` in terms of other ops.
    Any ``Op`` may be declared so (its description gives it the derived
    forward, shape inference and backward graph); this base says it, and
    lets a subclass's own ``infer`` or ``cpu`` call ``super()`` for the
    derived one.

    Example::

        class Softplus(Composite):
            name = "softplus"
            def decompose(self, x):
                return F.log(F.exp(x) + 1)
    """

    infer = _decomposed_infer
    cpu = _decomposed_cpu
    cuda = _decomposed_cuda


# the shape inference of an op declared by decompose traces it with
# gradcore.graph, which sits above this module: it hands its tracer over when it loads
_composite_tracer = None


def install_composite_tracer(tracer) -> None:
    """Called by ``gradcore.graph`` at import: ``tracer(op, descs)`` gives
    the output descriptors of an op declared by ``decompose`` by tracing it.

    Example::

        >>> install_composite_tracer(gradcore.graph.infer_by_tracing)
    """
    global _composite_tracer
    _composite_tracer = tracer


# ---- the forward path consults infer (see _core._guard_infer: once per op and input descriptors)
def _infer_check(op, args) -> int:
    """``op.infer`` on the descriptors of ``args``: raises the op's own error
    for inputs it rejects, and a clear one for an ``infer`` that does not
    return a tuple of ``TensorDesc`` (one per output); returns how many
    outputs it declares (the core holds the kernel's result to it)."""
    arity = describe(op).arity
    if arity is not None:
        low, high = arity[1]
        if len(args) < low or (high is not None and len(args) > high):
            takes = f"{low}" if low == high else f"{low} to {high}" if high is not None else f"at least {low}"
            raise TypeError(f"{op._name()}: takes {takes} input{'s' * (takes != '1')}, got {len(args)}")
    return len(checked_infer_result(op, op.infer(*[TensorDesc(t.shape, t.dtype, t._device) for t in args])))


def checked_infer_result(op, out) -> tuple:
    """``out``, what ``op.infer`` returned, if it is a tuple (or list) of
    ``TensorDesc``; else a TypeError naming the op and saying what to return.

    Example::

        >>> checked_infer_result(op, (TensorDesc((2,), "float32"),))
    """
    if not isinstance(out, (tuple, list)) or not all(isinstance(d, TensorDesc) for d in out):
        what = "a TensorDesc: return (desc,)" if isinstance(out, TensorDesc) else repr(out)[:80]
        raise TypeError(f"{op._name()}: infer must return a tuple of TensorDesc, one per output; got {what}")
    return tuple(out)


_core._install_hooks(infer_check=_infer_check, describe=describe)
