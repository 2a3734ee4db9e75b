"""Elementwise ops: one declarative row each.

A row is (mode, NumPy expression, CUDA expression, derivative per input).
From it come the CPU kernel, the CUDA C kernel source, the VJP (the
derivative expressions, traced into the generic backward graph) and a
gradcheck case. In the expressions ``x``, ``y`` are the inputs, ``out`` the
output and ``g`` the output gradient; the derivative expressions may call
any elementwise mode by name (``cos(x)``, ``where(c, a, b)``, ...).
A derivative of ``None`` marks the input as not differentiable.

Broadcasting needs no care in a row: gradients come back in the output's
shape and the core sums them down to each input's shape, once, centrally.
"""
from __future__ import annotations

import math
import re
import warnings
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np

from gradcore import _core
from gradcore.op import Op, TensorDesc


class Row(NamedTuple):
    mode: str
    numpy: str                      # expression in x (and y, z)
    cuda: str                       # CUDA C expression in x (and y, z)
    grads: Optional[Tuple[Optional[str], ...]]  # derivative expression per input, or None
    domain: Tuple[float, float] = (-2.0, 2.0)   # where gradcheck samples inputs
    out_dtype: Optional[str] = None             # "bool" for predicates


# fmt: off
TABLE = [
    # arithmetic
    Row("add",      "np.add(x, y)",           "x + y",              ("g", "g")),
    Row("sub",      "np.subtract(x, y)",      "x - y",              ("g", "-g")),
    Row("mul",      "np.multiply(x, y)",      "x * y",              ("g * y", "g * x")),
    Row("div",      "np.true_divide(x, y)",   "x / y",              ("g / y", "-(g * out) / y"), (0.5, 2.0)),
    Row("pow",      "np.power(x, y)",         "pow(x, y)",          ("g * y * x ** (y - 1)", "g * out * log(x)"), (0.5, 2.0)),
    Row("maximum",  "np.maximum(x, y)",       "fmax(x, y)",         ("where(x > y, g, where(eq(x, y), g * 0.5, 0))",
                                                                      "where(y > x, g, where(eq(x, y), g * 0.5, 0))")),
    Row("minimum",  "np.minimum(x, y)",       "fmin(x, y)",         ("where(x < y, g, where(eq(x, y), g * 0.5, 0))",
                                                                      "where(y < x, g, where(eq(x, y), g * 0.5, 0))")),
    Row("floor_div", "np.floor_divide(x, y)", "floor(x / y)",       (None, None), (0.5, 2.0)),
    Row("mod",      "np.mod(x, y)",           "x - floor(x / y) * y", ("g", "-(g * floor_div(x, y))"), (0.5, 2.0)),
    Row("neg",      "np.negative(x)",         "-x",                 ("-g",)),
    Row("abs",      "np.abs(x)",              "fabs(x)",            ("g * sign(x)",)),
    Row("sign",     "np.sign(x)",             "(T)((x > 0) - (x < 0))", (None,)),
    Row("square",   "np.square(x)",           "x * x",              ("g * x * 2",)),
    Row("sqrt",     "np.sqrt(x)",             "sqrt(x)",            ("g / (out * 2)",), (0.5, 2.0)),
    # exponentials and logarithms
    Row("exp",      "np.exp(x)",              "exp(x)",             ("g * out",)),
    Row("expm1",    "np.expm1(x)",            "expm1(x)",           ("g * (out + 1)",)),
    Row("log",      "np.log(x)",              "log(x)",             ("g / x",), (0.5, 2.0)),
    Row("log1p",    "np.log1p(x)",            "log1p(x)",           ("g / (x + 1)",), (-0.5, 2.0)),
    # trigonometric and hyperbolic
    Row("sin",      "np.sin(x)",              "sin(x)",             ("g * cos(x)",)),
    Row("cos",      "np.cos(x)",              "cos(x)",             ("-(g * sin(x))",)),
    Row("tan",      "np.tan(x)",              "tan(x)",             ("g * (out * out + 1)",), (-1.0, 1.0)),
    Row("tanh",     "np.tanh(x)",             "tanh(x)",            ("g * (1 - out * out)",)),
    Row("asin",     "np.arcsin(x)",           "asin(x)",            ("g / sqrt(1 - x * x)",), (-0.9, 0.9)),
    Row("acos",     "np.arccos(x)",           "acos(x)",            ("-(g / sqrt(1 - x * x))",), (-0.9, 0.9)),
    Row("atan",     "np.arctan(x)",           "atan(x)",            ("g / (x * x + 1)",)),
    Row("sinh",     "np.sinh(x)",             "sinh(x)",            ("g * cosh(x)",)),
    Row("cosh",     "np.cosh(x)",             "cosh(x)",            ("g * sinh(x)",)),
    Row("asinh",    "np.arcsinh(x)",          "asinh(x)",           ("g / sqrt(x * x + 1)",)),
    Row("acosh",    "np.arccosh(x)",          "acosh(x)",           ("g / sqrt(x * x - 1)",), (1.2, 3.0)),
    Row("atanh",    "np.arctanh(x)",          "atanh(x)",           ("g / (1 - x * x)",), (-0.9, 0.9)),
    Row("erf",      "_erf(x)",                "erf(x)",             ("g * exp(-(x * x)) * 1.1283791670955126",)),
    # activations
    Row("sigmoid",  "(np.tanh(x * 0.5) + 1) * 0.5", "1 / (1 + exp(-x))", ("g * out * (1 - out)",)),
    Row("relu",     "np.maximum(x, 0)",       "fmax(x, (T)0)",      ("g * (out > 0)",)),
    Row("softplus", "np.logaddexp(x, 0)",     "log1p(exp(-fabs(x))) + fmax(x, (T)0)", ("g * sigmoid(x)",)),
    Row("logsigmoid", "-np.logaddexp(-x, 0)", "-(log1p(exp(-fabs(x))) + fmax(-x, (T)0))", ("g * sigmoid(-x)",)),
    Row("silu",     "x * ((np.tanh(x * 0.5) + 1) * 0.5)", "x / (1 + exp(-x))",
                                                                    ("g * (sigmoid(x) * (1 + x * (1 - sigmoid(x))))",)),
    Row("gelu",     "x * (_erf(x * 0.7071067811865476) + 1) * 0.5", "x * (T)0.5 * (1 + erf(x * (T)0.7071067811865476))",
                    ("g * ((erf(x * 0.7071067811865476) + 1) * 0.5 + x * exp(x * x * -0.5) * 0.3989422804014327)",)),
    # selection
    Row("where",    "np.where(x, y, z)",      "x ? y : z",          (None, "where(x, g, 0)", "where(x, 0, g)")),
    # rounding (zero gradient almost everywhere: not differentiable here)
    Row("floor",    "np.floor(x)",            "floor(x)",           (None,)),
    Row("ceil",     "np.ceil(x)",             "ceil(x)",            (None,)),
    Row("round",    "np.round(x)",            "rint(x)",            (None,)),
    # predicates
    Row("lt",       "np.less(x, y)",          "x < y",              (None, None), out_dtype="bool"),
    Row("le",       "np.less_equal(x, y)",    "x <= y",             (None, None), out_dtype="bool"),
    Row("gt",       "np.greater(x, y)",       "x > y",              (None, None), out_dtype="bool"),
    Row("ge",       "np.greater_equal(x, y)", "x >= y",             (None, None), out_dtype="bool"),
    Row("eq",       "np.equal(x, y)",         "x == y",             (None, None), out_dtype="bool"),
    Row("ne",       "np.not_equal(x, y)",     "x != y",             (None, None), out_dtype="bool"),
    Row("logical_not", "np.logical_not(x)",   "!x",                 (None,), out_dtype="bool"),
    Row("logical_and", "np.logical_and(x, y)", "x && y",            (None, None), out_dtype="bool"),
    Row("logical_or",  "np.logical_or(x, y)",  "x || y",            (None, None), out_dtype="bool"),
    Row("logical_xor", "np.logical_xor(x, y)", "x != y",            (None, None), out_dtype="bool"),
]
# fmt: on

ROWS: Dict[str, Row] = {r.mode: r for r in TABLE}
_ARGS = ("x", "y", "z")
_UFUNC_CALL = re.compile(r"^np\.(\w+)\(([xyz](?:, [xyz])*)\)$")


def _arity(row: Row) -> int:
    return len(row.grads) if row.grads is not None else 1


def _cpu_kernel(row: Row):
    """The NumPy kernel: the ufunc itself when the expression is one call
    (no Python frame per op), else the expression compiled once."""
    n = _arity(row)
    m = _UFUNC_CALL.match(row.numpy)
    if m and m.group(2) == ", ".join(_ARGS[:n]) and isinstance(getattr(np, m.group(1), None), np.ufunc):
        return getattr(np, m.group(1))
    src = f"lambda {', '.join(_ARGS[:n])}: {row.numpy}"
    return eval(src, {"np": np, "_erf": _erf})  # noqa: S307 - our own table


_erf_object = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    """erf for NumPy arrays (NumPy has none; math.erf is exact to double
    precision, at the price of a Python call per element)."""
    x = np.asarray(x)
    return np.asarray(_erf_object(x), dtype=x.dtype if x.dtype.kind == "f" else np.float64)


def cuda_source(row: Row, ctype: str = "float") -> str:
    """CUDA C source of the row's forward kernel for one element type
    (contiguous inputs of the output's size; broadcasting inputs are
    expanded by the backend before launch)."""
    n = _arity(row)
    in_t = "bool" if row.mode in ("where",) else ctype
    params = []
    for i in range(n):
        t = in_t if (i == 0 and row.mode == "where") else ctype
        params.append(f"const {t}* __restrict__ in{i}")
    out_t = "bool" if row.out_dtype == "bool" else ctype
    loads = "\n".join(f"        const {('bool' if (i == 0 and row.mode == 'where') else 'T')} {_ARGS[i]} = in{i}[i];"
                      for i in range(n))
    return (
        f"typedef {ctype} T;\n"
        f"extern \"C\" __global__ void gc_{row.mode}_{ctype.replace(' ', '_')}("
        f"{', '.join(params)}, {out_t}* __restrict__ out, long long n)\n"
        "{\n"
        "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
        "         i += (long long)blockDim.x * gridDim.x) {\n"
        f"{loads}\n"
        f"        out[i] = ({out_t})({row.cuda});\n"
        "    }\n"
        "}\n")


# ---- the namespace derivative expressions are evaluated in
def _mode_fn(mode):
    def fn(*args):
        return _core.apply(Elemwise(mode), *args)[0]
    fn.__name__ = mode
    return fn


_GRAD_NS = {r.mode: _mode_fn(r.mode) for r in TABLE}


def _make_vjp(row: Row):
    n = _arity(row)
    exprs = row.grads
    fns = [None if e is None else eval(f"lambda {', '.join(_ARGS[:n])}, out, g: {e}", _GRAD_NS)
           for e in exprs]

    def vjp(inputs, outputs, grads):
        out, g = outputs[0], grads[0]
        return [None if f is None else f(*inputs, out, g) for f in fns]
    return vjp


_DTYPE_CACHE: Dict[tuple, np.dtype] = {}


def _broadcast(op, descs):
    shapes = [d.shape for d in descs]
    if any(s is None for s in shapes):
        return None
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise op.error("shapes cannot be broadcast together", *descs) from None


class Elemwise(Op):
    """An elementwise op; ``mode`` names its row in ``TABLE``.

    Example::

        >>> y, = gradcore.core.apply(Elemwise("mul"), a, b)
    """

    name = "Elemwise"
    attrs = ("mode",)
    reduce_broadcast = True
    _instances: Dict[str, "Elemwise"] = {}

    def __new__(cls, mode: str):
        inst = cls._instances.get(mode)
        if inst is None:
            row = ROWS.get(mode)
            if row is None:
                raise ValueError(f"Elemwise: unknown mode {mode!r}; known modes: {', '.join(sorted(ROWS))}")
            inst = super().__new__(cls)
            inst.mode = mode
            inst.row = row
            inst.nin = _arity(row)
            inst.cpu = _cpu_kernel(row)
            inst.vjp = _make_vjp(row)
            inst._seal()
            cls._instances[mode] = inst
        return inst

    def __init__(self, mode: str):  # everything happened in __new__
        pass

    # per instance, __new__ binds ``cpu`` to the row's NumPy kernel and
    # ``vjp`` to its derivative expressions; these class-level versions say
    # what the protocol is (and what the registry reports)
    def cpu(self, *arrays):
        return _cpu_kernel(self.row)(*arrays)

    def vjp(self, inputs, outputs, grads):
        return _make_vjp(self.row)(inputs, outputs, grads)

    @classmethod
    def examples(cls):
        """Sample inputs for ``gradcore.testing.check_op`` (and ``gradcore check``):
        a binary, a broadcasting and a unary mode, away from kinks."""
        rng = np.random.default_rng(0)
        return [(cls("mul"), [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (3,))]),
                (cls("add"), [rng.uniform(-1, 1, (3, 1)), rng.uniform(-1, 1, (1, 2))]),
                (cls("tanh"), [rng.uniform(-1, 1, (4,))])]

    def __reduce__(self):
        return (Elemwise, (self.mode,))

    def _name(self):
        return f"Elemwise({self.mode})"

    def infer(self, *descs: TensorDesc):
        if len(descs) != self.nin:
            raise self.error(f"takes {self.nin} inputs, got {len(descs)}", *descs)
        shape = _broadcast(self, descs)
        key = (self.mode,) + tuple(d.dtype for d in descs)
        dtype = _DTYPE_CACHE.get(key)
        if dtype is None:
            if self.row.out_dtype:
                dtype = np.dtype(self.row.out_dtype)
            else:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    probe = [np.ones((), d) for d in descs]
                    dtype = np.asarray(self.cpu(*probe)).dtype
            _DTYPE_CACHE[key] = dtype
        return (TensorDesc(shape, dtype, descs[0].device),)

    def cuda_source(self, ctype: str = "float") -> str:
        return cuda_source(self.row, ctype)

    def cuda(self, be, *xs):
        (out,) = self.infer(*[TensorDesc(x.shape, x.dtype, "cuda") for x in xs])
        # the kernel computes in one C type: the output's, or for predicates
        # the inputs' common type; a where's condition stays bool
        if out.dtype == np.bool_ and self.mode != "where":
            compute = np.result_type(*[x.dtype for x in xs])
        else:
            compute = out.dtype
        args = [be.broadcast_to(be.cast(x, np.bool_ if (i == 0 and self.mode == "where") else compute), out.shape)
                for i, x in enumerate(xs)]
        y = be.empty(out.shape, out.dtype)
        be.launch_n(be.kernel(self, be.ctype(compute)), y.size, *args, y, y.size)
        return y


def modes():
    """All elementwise modes, in table order."""
    return [r.mode for r in TABLE]
