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

from gradcore import _core, dtypes
from gradcore.cpu import _kernels as _fast
from gradcore.cuda.kernels import Kernel
from gradcore.op import Op, TensorDesc


class Row(NamedTuple):
    mode: str
    numpy: str                      # expression in x (and y, z)
    cuda: str                       # CUDA C expression in x (and y, z)
    grads: Optional[Tuple[Optional[str], ...]]  # derivative expression per input, or None
    domain: Tuple[float, float] = (-2.0, 2.0)   # where gradcheck samples inputs
    out_dtype: Optional[str] = None             # "bool" for predicates
    # how the mode treats dtypes, one of gradcore.dtypes.ELEMWISE_RULES:
    # "same", "float" (integer and bool inputs computed in float32), "compare",
    # "logical", "select"
    dtypes: str = "same"


# fmt: off
TABLE = [
    # arithmetic
    Row("add",      "np.add(x, y)",           "x + y",              ("g", "g")),
    Row("sub",      "np.subtract(x, y)",      "x - y",              ("g", "-g")),
    Row("mul",      "np.multiply(x, y)",      "x * y",              ("g * y", "g * x")),
    Row("div",      "np.true_divide(x, y)",   "x / y",              ("g / y", "-(g * out) / y"), (0.5, 2.0), dtypes="float"),
    # at x = 0 PyTorch's choices: d/dx is 0 where y = 0 (0 * 0 ** -1 would be NaN),
    # d/dy is 0 (out * log(x) would be 0 * -inf)
    Row("pow",      "np.power(x, y)",         "gc_pow(x, y)",       ("where(eq(y, 0), 0, g * y * x ** (y - 1))",
                                                                     "g * out * log(where(eq(x, 0), 1, x))"), (0.5, 2.0), dtypes="float"),
    # a tie's gradient goes wholly to x, MegEngine's rule (its Elemwise MAX /
    # MIN grads: x where y <= x, y where x < y); PyTorch splits it in halves
    Row("maximum",  "np.maximum(x, y)",       "gc_max(x, y)",       ("where(y <= x, g, 0)", "where(x < y, g, 0)")),
    Row("minimum",  "np.minimum(x, y)",       "gc_min(x, y)",       ("where(x <= y, g, 0)", "where(y < x, g, 0)")),
    Row("floor_div", "np.floor_divide(x, y)", "gc_floor_div(x, y)", (None, None), (0.5, 2.0)),
    Row("mod",      "np.mod(x, y)",           "gc_mod(x, y)",       ("g", "-(g * floor_div(x, y))"), (0.5, 2.0)),
    Row("neg",      "np.negative(x)",         "-x",                 ("-g",)),
    Row("abs",      "np.abs(x)",              "gc_abs(x)",          ("g * sign(x)",)),
    Row("sign",     "np.sign(x)",             "x != x ? x : (T)((x > 0) - (x < 0))", ("g * 0",)),
    Row("square",   "np.square(x)",           "x * x",              ("g * x * 2",)),
    Row("sqrt",     "np.sqrt(x)",             "sqrt(x)",            ("g / (out * 2)",), (0.5, 2.0), dtypes="float"),
    # exponentials and logarithms
    Row("exp",      "np.exp(x)",              "exp(x)",             ("g * out",), dtypes="float"),
    Row("expm1",    "np.expm1(x)",            "expm1(x)",           ("g * (out + 1)",), dtypes="float"),
    Row("log",      "np.log(x)",              "log(x)",             ("g / x",), (0.5, 2.0), dtypes="float"),
    Row("log1p",    "np.log1p(x)",            "log1p(x)",           ("g / (x + 1)",), (-0.5, 2.0), dtypes="float"),
    # trigonometric and hyperbolic
    Row("sin",      "np.sin(x)",              "sin(x)",             ("g * cos(x)",), dtypes="float"),
    Row("cos",      "np.cos(x)",              "cos(x)",             ("-(g * sin(x))",), dtypes="float"),
    Row("tan",      "np.tan(x)",              "tan(x)",             ("g * (out * out + 1)",), (-1.0, 1.0), dtypes="float"),
    Row("tanh",     "np.tanh(x)",             "tanh(x)",            ("g * (1 - out * out)",), dtypes="float"),
    Row("asin",     "np.arcsin(x)",           "asin(x)",            ("g / sqrt(1 - x * x)",), (-0.9, 0.9), dtypes="float"),
    Row("acos",     "np.arccos(x)",           "acos(x)",            ("-(g / sqrt(1 - x * x))",), (-0.9, 0.9), dtypes="float"),
    Row("atan",     "np.arctan(x)",           "atan(x)",            ("g / (x * x + 1)",), dtypes="float"),
    # atan2(y, x) as atan2(x, y) here: the angle of the point (y, x); the sign of zero
    # decides as in C and NumPy (atan2(0, -0.0) is pi); gradient 0 at the origin, as torch
    Row("atan2",    "np.arctan2(x, y)",       "atan2(x, y)",        ("g * y / where(eq(x * x + y * y, 0), 1, x * x + y * y)",
                                                                     "-(g * x) / where(eq(x * x + y * y, 0), 1, x * x + y * y)"),
                    dtypes="float"),
    Row("sinh",     "np.sinh(x)",             "sinh(x)",            ("g * cosh(x)",), dtypes="float"),
    Row("cosh",     "np.cosh(x)",             "cosh(x)",            ("g * sinh(x)",), dtypes="float"),
    Row("asinh",    "np.arcsinh(x)",          "asinh(x)",           ("g / sqrt(x * x + 1)",), dtypes="float"),
    Row("acosh",    "np.arccosh(x)",          "acosh(x)",           ("g / sqrt(x * x - 1)",), (1.2, 3.0), dtypes="float"),
    Row("atanh",    "np.arctanh(x)",          "atanh(x)",           ("g / (1 - x * x)",), (-0.9, 0.9), dtypes="float"),
    Row("erf",      "_erf(x)",                "erf(x)",             ("g * exp(-(x * x)) * 1.1283791670955126",), dtypes="float"),
    # activations
    # _sigmoid: from exp(-|x|), no cancellation in the negative tail (1 + tanh(x/2)
    # would lose it), no overflow for large |x|
    Row("sigmoid",  "_sigmoid(x)",            "1 / (1 + exp(-x))", ("g * out * (1 - out)",), dtypes="float"),
    # a selection, not g * mask: an infinite g where x < 0 (sqrt(relu(x))) gives 0, as PyTorch's
    Row("relu",     "np.maximum(x, 0)",       "gc_max(x, (T)0)",    ("where(out > 0, g, 0)",)),
    Row("softplus", "np.logaddexp(x, 0)",     "log1p(exp(-gc_abs(x))) + gc_max(x, (T)0)", ("g * sigmoid(x)",), dtypes="float"),
    Row("logsigmoid", "-np.logaddexp(-x, 0)", "-(log1p(exp(-gc_abs(x))) + gc_max(-x, (T)0))", ("g * sigmoid(-x)",), dtypes="float"),
    Row("silu",     "x * _sigmoid(x)",        "x / (1 + exp(-x))",
                                                                    ("g * (sigmoid(x) * (1 + x * (1 - sigmoid(x))))",), dtypes="float"),
    Row("gelu",     "x * (_erf(x * 0.7071067811865476) + 1) * 0.5", "x * (T)0.5 * (1 + erf(x * (T)0.7071067811865476))",
                    ("g * ((erf(x * 0.7071067811865476) + 1) * 0.5 + x * exp(x * x * -0.5) * 0.3989422804014327)",), dtypes="float"),
    # selection
    Row("where",    "np.where(x, y, z)",      "x ? y : z",          (None, "where(x, g, 0)", "where(x, 0, g)"), dtypes="select"),
    # rounding: zero gradient (almost everywhere), a zero .grad as in PyTorch
    Row("floor",    "np.floor(x)",            "gc_floor(x)",        ("g * 0",)),
    Row("ceil",     "np.ceil(x)",             "gc_ceil(x)",         ("g * 0",)),
    # half away from zero, as MegEngine's kernels (C's round) and its examples
    Row("round",    "round_half_away(x)",     "gc_round(x)",        ("g * 0",)),
    # predicates
    Row("lt",       "np.less(x, y)",          "x < y",              (None, None), out_dtype="bool", dtypes="compare"),
    Row("le",       "np.less_equal(x, y)",    "x <= y",             (None, None), out_dtype="bool", dtypes="compare"),
    Row("gt",       "np.greater(x, y)",       "x > y",              (None, None), out_dtype="bool", dtypes="compare"),
    Row("ge",       "np.greater_equal(x, y)", "x >= y",             (None, None), out_dtype="bool", dtypes="compare"),
    Row("eq",       "np.equal(x, y)",         "x == y",             (None, None), out_dtype="bool", dtypes="compare"),
    Row("ne",       "np.not_equal(x, y)",     "x != y",             (None, None), out_dtype="bool", dtypes="compare"),
    Row("logical_not", "np.logical_not(x)",   "!x",                 (None,), out_dtype="bool", dtypes="logical"),
    Row("logical_and", "np.logical_and(x, y)", "x && y",            (None, None), out_dtype="bool", dtypes="logical"),
    Row("logical_or",  "np.logical_or(x, y)",  "x || y",            (None, None), out_dtype="bool", dtypes="logical"),
    Row("logical_xor", "np.logical_xor(x, y)", "!x != !y",          (None, None), out_dtype="bool", dtypes="logical"),
]
# fmt: on

ROWS: Dict[str, Row] = {r.mode: r for r in TABLE}
_ARGS = ("x", "y", "z")
_UFUNC_CALL = re.compile(r"^np\.(\w+)\(([xyz](?:, [xyz])*)\)$")


def _arity(row: Row) -> int:
    return len(row.grads) if row.grads is not None else 1


def _cpu_kernel(row: Row):
    """The NumPy kernel: the ufunc itself when the expression is one call
    (no Python frame per op), else the expression compiled once; for the
    modes in ``_FAST_KERNELS``, a C loop with the expression's results."""
    if row.mode in _FAST_KERNELS:
        return _FAST_KERNELS[row.mode]
    n = _arity(row)
    m = _UFUNC_CALL.match(row.numpy)
    if m and m.group(2) == ", ".join(_ARGS[:n]) and isinstance(getattr(np, m.group(1), None), np.ufunc):
        return getattr(np, m.group(1))
    src = f"lambda {', '.join(_ARGS[:n])}: {row.numpy}"
    return eval(src, {"np": np, "_erf": _erf, "_sigmoid": _sigmoid,  # noqa: S307 - our own table
                      "round_half_away": round_half_away})


def _sigmoid(x):
    """1 / (1 + e^-x) from e = exp(-|x|), which never overflows: 1 / (1 + e)
    for x >= 0, e / (1 + e) below (no cancellation in the negative tail).
    Within 4 float32 ulps of the exact value (exp(-logaddexp(0, -x)) was 9),
    and 5x faster."""
    e = np.abs(x)
    if isinstance(e, np.ndarray) and e.dtype.kind == "f":
        # in place in the one buffer this kernel owns: e, -e, exp(-e), then
        # the last step in C (NumPy's where branches per element: 8x slower)
        np.negative(e, out=e)
        np.exp(e, out=e)
        done = _fast.sigmoid_finish(x, e)
        if done is not None:
            return done
    else:
        e = np.exp(-e)
    return np.where(x >= 0, 1, e) / (1 + e)


def _where(c, a, b):
    """np.where, branch-free in C where the operands allow (gradcore.cpu._kernels)."""
    out = _fast.select(c, a, b)
    return np.where(c, a, b) if out is None else out


def _relu(x):
    """np.maximum(x, 0), in C for a contiguous float array (gradcore.cpu._kernels)."""
    out = _fast.relu(x)
    return np.maximum(x, 0) if out is None else out


# modes whose NumPy expression (the row's: the reference) NumPy runs slowly:
# C loops giving the same bits where the operands allow, else the expression
_FAST_KERNELS = {"where": _where, "relu": _relu}

_erf_object = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    """erf for NumPy arrays (NumPy has none): math.erf's values, exact to
    double precision; C's erf over a float array, else a Python call per
    element."""
    x = np.asarray(x)
    out = _fast.erf(x)
    if out is not None:
        return out
    return np.asarray(_erf_object(x), dtype=x.dtype if x.dtype.kind == "f" else np.float64)


def round_half_away(x):
    """x rounded to the nearest integer, halves away from zero (C's round;
    NumPy's rounds them to even): the integer part plus the sign where the
    fraction (exact: x minus its integer part) is at least a half."""
    x = np.asarray(x)
    if x.dtype.kind not in "fc":
        return x.copy()
    whole = np.trunc(x)
    with np.errstate(invalid="ignore"):     # inf - inf: not a half, inf stays
        return np.where(np.abs(x - whole) >= 0.5, whole + np.sign(x), whole).astype(x.dtype, copy=False)


# Device functions the rows' CUDA expressions call where C's operators and
# math functions differ from NumPy: NaN in maximum/minimum, Python's floor
# division and modulo (npy_divmod for floats; no trap on x / 0 or MIN / -1
# for integers), exact integer powers, abs and rounding of integers without
# a trip through double. Guarded: one definition per translation unit. Any
# kernel built from ``Row.cuda`` (the fused backward kernels too) needs it
# in front. No identifier T, x, y or z in here (those are the rows').
CUDA_HELPERS = r"""
#ifndef GC_ELEMWISE_HELPERS
#define GC_ELEMWISE_HELPERS
template <class V> __device__ __forceinline__ V gc_max(V a, V b) { return (a != a || a > b) ? a : b; }
template <class V> __device__ __forceinline__ V gc_min(V a, V b) { return (a != a || a < b) ? a : b; }
// -MIN wraps to MIN, as in NumPy (computed unsigned: no signed overflow)
template <class V> __device__ __forceinline__ V gc_neg_wrap(V a) { return (V)(0ULL - (unsigned long long)a); }
template <class V> __device__ __forceinline__ V gc_abs(V a) { return a < 0 ? gc_neg_wrap(a) : a; }
__device__ __forceinline__ bool gc_abs(bool a) { return a; }
__device__ __forceinline__ float gc_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double gc_abs(double a) { return fabs(a); }
// rounding: integers are already whole
template <class V> __device__ __forceinline__ V gc_floor(V a) { return a; }
template <class V> __device__ __forceinline__ V gc_ceil(V a) { return a; }
template <class V> __device__ __forceinline__ V gc_round(V a) { return a; }
__device__ __forceinline__ float gc_floor(float a) { return floorf(a); }
__device__ __forceinline__ double gc_floor(double a) { return floor(a); }
__device__ __forceinline__ float gc_ceil(float a) { return ceilf(a); }
__device__ __forceinline__ double gc_ceil(double a) { return ceil(a); }
__device__ __forceinline__ float gc_round(float a) { return roundf(a); }    // halves away from zero
__device__ __forceinline__ double gc_round(double a) { return round(a); }
// integer floor division and modulo, Python's signs; x / 0 is 0 as in NumPy
template <class V> __device__ __forceinline__ V gc_floor_div(V a, V b) {
    if (b == 0) return 0;
    if ((V)-1 < (V)0 && b == (V)-1) return gc_neg_wrap(a);
    V q = a / b;
    if (a % b != 0 && ((a < 0) != (b < 0))) q = q - 1;
    return q;
}
template <class V> __device__ __forceinline__ V gc_mod(V a, V b) {
    if (b == 0 || ((V)-1 < (V)0 && b == (V)-1)) return 0;
    V r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r = r + b;
    return r;
}
// floating floor division and modulo: NumPy's npy_divmod
template <class F> __device__ __forceinline__ F gc_divmod_float(F a, F b, F* mod) {
    F m = fmod(a, b);
    if (!b) { *mod = m; return a / b; }
    F div = (a - m) / b;
    if (m) {
        if ((b < 0) != (m < 0)) { m += b; div -= 1; }
    } else {
        m = copysign((F)0, b);
    }
    F fl;
    if (div) {
        fl = floor(div);
        if (div - fl > (F)0.5) fl += 1;
    } else {
        fl = copysign((F)0, a / b);
    }
    *mod = m;
    return fl;
}
__device__ __forceinline__ float gc_floor_div(float a, float b) { float m; return gc_divmod_float(a, b, &m); }
__device__ __forceinline__ double gc_floor_div(double a, double b) { double m; return gc_divmod_float(a, b, &m); }
__device__ __forceinline__ float gc_mod(float a, float b) { float m; gc_divmod_float(a, b, &m); return m; }
__device__ __forceinline__ double gc_mod(double a, double b) { double m; gc_divmod_float(a, b, &m); return m; }
// integer powers by squaring, wrapping as NumPy's (the launcher rejects
// negative exponents, as NumPy does)
template <class V> __device__ __forceinline__ V gc_pow(V a, V b) {
    unsigned long long r = 1, base = (unsigned long long)a;
    for (; b > 0; b = b / 2) {
        if (b % 2) r *= base;
        base *= base;
    }
    return (V)r;
}
__device__ __forceinline__ float gc_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double gc_pow(double a, double b) { return pow(a, b); }
#endif
"""


def cuda_source(row: Row, ctype: str = "float") -> str:
    """CUDA C source of the row's forward kernel for one element type:
    ``gc_<mode>_<ctype>(in0, n0, in1, n1, ..., out, n)``; out is contiguous
    of n elements, a grid-stride loop over them. Input k is contiguous of
    n_k elements and read at ``i % n_k``: n_k = n (the output's shape), 1 (a
    scalar) or the size of a trailing part of the output's shape (a bias);
    the launcher expands inputs that broadcast otherwise, and casts them to
    ``ctype`` (a where's condition to bool; a predicate's output is bool)."""
    types = ["bool" if (k == 0 and row.mode == "where") else "T" for k in range(_arity(row))]
    out_t = "bool" if row.out_dtype == "bool" else "T"
    params = [f"const {t}* __restrict__ in{k}, long long n{k}" for k, t in enumerate(types)]
    loads = [f"const {t} {_ARGS[k]} = in{k}[n{k} == n ? i : n{k} == 1 ? 0 : i % n{k}];" for k, t in enumerate(types)]
    return Kernel(row.mode, ", ".join(params + [f"{out_t}* __restrict__ out", "long long n"]),
                  "\n".join(loads + [f"out[i] = ({out_t})({row.cuda});"]), over="n", index="i"
                  ).source(ctype, helpers=CUDA_HELPERS)


# ---- the namespace derivative expressions are evaluated in
def _mode_fn(mode):
    def fn(*args):
        return _core.apply(Elemwise(mode), *args)[0]
    fn.__name__ = mode
    return fn


_GRAD_NS = {r.mode: _mode_fn(r.mode) for r in TABLE}


def expression(params: str, body: str):
    """A function of ``params`` computing ``body``, an expression in the
    rows' language (any elementwise mode by name, operators, scalars), on
    tensors or traced values: how a derivative written as a row's is used
    by another op's ``vjp``.

    Example::

        >>> relu_grad = expression("out, g", "where(out > 0, g, 0)")
        >>> gx = relu_grad(y, g)
    """
    return eval(f"lambda {params}: {body}", _GRAD_NS)


def _make_vjp(row: Row):
    n = _arity(row)
    exprs = row.grads
    params = ", ".join(_ARGS[:n] + ("out", "g"))
    fns = [None if e is None else expression(params, e) for e in exprs]

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

        >>> from gradcore.functional import Elemwise
        >>> y, = gc.core.apply(Elemwise("mul"), gc.tensor([2.0, 3.0]), gc.tensor([4.0, 5.0]))
        >>> y.numpy()
        array([ 8., 15.], dtype=float32)
    """

    name = "Elemwise"
    attrs = ("mode",)
    reduce_broadcast = True
    row = None                # derived from mode in __init__ (not parameters)
    nin = -1

    def __init__(self, mode: str):
        row = ROWS.get(mode)
        if row is None:
            raise ValueError(f"Elemwise: unknown mode {mode!r}; known modes: {', '.join(sorted(ROWS))}")
        self.mode = mode
        self.row = row
        self.nin = _arity(row)
        self.cpu = _cpu_kernel(row)
        self.vjp = _make_vjp(row)
        self._cuda_plans = {}

    # per instance, __init__ binds ``cpu`` to the row's NumPy kernel and
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
        _, dtype = self._dtypes(tuple(d.dtype for d in descs), descs)
        return (TensorDesc(shape, dtype, descs[0].device),)

    def input_dtypes(self, in_dtypes):
        """gradcore's dtype rules (gradcore.dtypes): ``(op, the dtype each
        input is cast to)``; asked when the inputs are not all of one
        floating dtype."""
        return self, self._dtypes(tuple(in_dtypes), ())[0]

    def _dtypes(self, in_dtypes, descs):
        """(dtype each input is computed in, result dtype), once per signature.
        Where NumPy's kernel already gives the rule's result from the inputs
        as they are and no floating input would change dtype (float32 * bool),
        they are not cast; else they are cast
        to the rule's dtypes, and a mode NumPy does not define for those
        (bool - bool) is a TypeError."""
        key = (self.mode,) + in_dtypes
        hit = _DTYPE_CACHE.get(key)
        if hit is not None:
            return hit
        try:
            want, out = dtypes.elemwise_dtypes(self.row.dtypes, in_dtypes)
        except TypeError as exc:
            raise TypeError(f"{self._name()}: {exc} (input dtypes: "
                            f"{', '.join(str(d) for d in in_dtypes)})") from None
        if self._numpy_dtype(in_dtypes) == out and all(
                d.kind != "f" or d == w for d, w in zip(in_dtypes, want)):
            # a floating input in another dtype (float16 * float32) is still
            # cast: the recorded Cast brings its gradient back in its own dtype
            want = in_dtypes
        got = self._numpy_dtype(want)
        if got != out:
            shapes = f" (input shapes: {', '.join(str(d.shape) for d in descs)})" if descs else ""
            raise TypeError(f"{self._name()}: not defined for {', '.join(str(d) for d in want)} inputs{shapes}")
        _DTYPE_CACHE[key] = (want, out)
        return want, out

    def _numpy_dtype(self, in_dtypes):
        """The dtype the NumPy kernel gives for inputs of ``in_dtypes`` (None
        where it refuses them)."""
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                # 1-d, not 0-d: NumPy 1.x promotes 0-d arrays by value like
                # Python numbers (np.logaddexp(0, float32) is float64 there)
                return np.asarray(self.cpu(*[np.ones((1,), d) for d in in_dtypes])).dtype
            except TypeError:
                return None

    def cuda_source(self, ctype: str = "float") -> str:
        return cuda_source(self.row, ctype)

    def cuda(self, be, *xs, out=None):
        """The kernel on device arrays ``xs`` into a new array, or into
        ``out`` (an array of the result's shape and dtype that the kernel may
        write while it reads the inputs: each element is read and written by
        one thread, so ``out`` may be an input itself, not an overlapping
        view of one; the caller checks)."""
        # the plan (output, C type, per-input cast and broadcast, kernel)
        # depends only on the input shapes and dtypes: made once per signature
        key = (be,) + tuple([(x.shape, x.dtype) for x in xs])
        plan = self._cuda_plans.get(key)
        if plan is None:
            plan = self._cuda_plan(be, xs)
            if len(self._cuda_plans) > 4096:
                self._cuda_plans.clear()
            self._cuda_plans[key] = plan
        out_shape, out_dtype, size, casts, kernel, check_pow = plan
        if check_pow and be.reduce("min", xs[1]).item() < 0:
            # NumPy raises rather than give 1 / x**n in integers (costs a sync)
            raise ValueError("Integers to negative integer powers are not allowed.")
        args = []
        for x, (dtype, expand) in zip(xs, casts):
            if dtype is not None:
                x = be.cast(x, dtype)
            if expand:
                x = be.broadcast_to(x, out_shape)
            args += [x, x.size]
        if out is not None and out.shape == out_shape and out.dtype == out_dtype:
            y = out
            be.written(y)
        else:
            y = be.empty(out_shape, out_dtype)
        if size:
            be.launch_n(kernel, size, *args, y, size)
        if out is not None and y is not out:
            be.copy_into(out, y)         # another shape or dtype: NumPy's casting rules apply there
            return out
        return y

    def _cuda_plan(self, be, xs):
        (out,) = self.infer(*[TensorDesc(x.shape, x.dtype, "cuda") for x in xs])
        # the result dtype the CPU kernel gives for these very inputs: through
        # the core they come cast by gradcore's dtype rules, so this is the
        # rule's; called directly, the kernel computes as NumPy, as ``cpu`` does
        out_dtype = self._numpy_dtype(tuple(x.dtype for x in xs))
        if out_dtype is None:
            raise TypeError(f"{self._name()}: not defined for {', '.join(str(x.dtype) for x in xs)} inputs")
        # the kernel computes in one C type: the output's, or for predicates
        # the inputs' common type; a where's condition stays bool
        if out_dtype == np.bool_ and self.mode != "where":
            compute = np.result_type(*[x.dtype for x in xs])
        else:
            compute = out_dtype
        if compute == np.float16:
            # NumPy's result type for e.g. sqrt of int8/uint8/bool inputs
            raise TypeError(f"{self._name()}: cuda has no float16 kernels (NumPy computes this in float16 "
                            f"for inputs {', '.join(str(x.dtype) for x in xs)}); cast the inputs to float32")
        size = int(math.prod(out.shape))
        casts = []
        for i, x in enumerate(xs):
            want = np.dtype(np.bool_) if (i == 0 and self.mode == "where") else compute
            casts.append((None if x.dtype == want else want, not _reads_in_place(x.shape, out.shape)))
        check_pow = bool(self.mode == "pow" and compute.kind in "iu" and xs[1].dtype.kind == "i" and size)
        return tuple(out.shape), np.dtype(out_dtype), size, casts, be.kernel(self, be.ctype(compute)), check_pow


def _reads_in_place(shape, out_shape) -> bool:
    """Whether the kernel reads an input of ``shape`` broadcast to
    ``out_shape`` at ``i % size``: same size, a single element, or (leading
    1s aside) a trailing part of the output's shape."""
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return not shape or tuple(out_shape[len(out_shape) - len(shape):]) == shape


def modes():
    """All elementwise modes, in table order."""
    return [r.mode for r in TABLE]
