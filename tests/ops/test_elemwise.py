"""Every row of the elementwise table: values against NumPy and PyTorch,
first and second order gradients against finite differences, gradients
against PyTorch, broadcasting, dtypes and shape errors.

The cases are generated from ``ops.elemwise.TABLE``: a new row is tested
as soon as it has a reference below (and ``test_every_row_has_references``
fails until it does)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import gradcore
from gradcore.core import apply
from gradcore.ops.elemwise import TABLE, Elemwise
import gradcore.functional as F

# ---------------------------------------------------------------- references
# independent NumPy forms (not the table's expressions)
NUMPY_REF = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "pow": lambda x, y: np.exp(y * np.log(x)),
    "maximum": lambda x, y: np.where(x >= y, x, y),
    "minimum": lambda x, y: np.where(x <= y, x, y),
    "floor_div": lambda x, y: np.floor(x / y),
    "mod": lambda x, y: x - np.floor(x / y) * y,
    "neg": lambda x: 0.0 - x,
    "abs": lambda x: np.where(x < 0, -x, x),
    "sign": lambda x: (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype),
    "square": lambda x: x * x,
    "sqrt": lambda x: x ** 0.5,
    "exp": lambda x: np.e ** x,
    "expm1": lambda x: np.exp(x) - 1,
    "log": np.log,
    "log1p": lambda x: np.log(1 + x),
    "sin": np.sin,
    "cos": np.cos,
    "tan": lambda x: np.sin(x) / np.cos(x),
    "tanh": lambda x: (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.where(x > 0, x, 0 * x),
    "where": lambda c, x, y: np.where(c, x, y),
    "floor": np.floor,
    "ceil": np.ceil,
    "round": lambda x: np.round(x),
    "lt": lambda x, y: x < y,
    "le": lambda x, y: x <= y,
    "gt": lambda x, y: x > y,
    "ge": lambda x, y: x >= y,
    "eq": lambda x, y: x == y,
    "ne": lambda x, y: x != y,
    "logical_not": lambda x: ~x.astype(bool),
    "logical_and": lambda x, y: x.astype(bool) & y.astype(bool),
    "logical_or": lambda x, y: x.astype(bool) | y.astype(bool),
    "logical_xor": lambda x, y: x.astype(bool) ^ y.astype(bool),
    "asin": np.arcsin,
    "atan2": lambda y, x: 2 * np.arctan(y / (np.sqrt(x * x + y * y) + x)),   # the half-angle form
    "acos": lambda x: np.pi / 2 - np.arcsin(x),
    "atan": np.arctan,
    "sinh": lambda x: (np.exp(x) - np.exp(-x)) / 2,
    "cosh": lambda x: (np.exp(x) + np.exp(-x)) / 2,
    "asinh": lambda x: np.log(x + np.sqrt(x * x + 1)),
    "acosh": lambda x: np.log(x + np.sqrt(x * x - 1)),
    "atanh": lambda x: 0.5 * np.log((1 + x) / (1 - x)),
    "erf": lambda x: np.vectorize(math.erf, otypes=[x.dtype])(x),
    "softplus": lambda x: np.log(1 + np.exp(x)),
    "logsigmoid": lambda x: -np.log(1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf, otypes=[x.dtype])(x / np.sqrt(2))),
}

# the PyTorch function of each mode (torch.<name>)
TORCH_NAME = {m: m for m in NUMPY_REF}
TORCH_NAME.update(floor_div="floor_divide", mod="remainder")
# activations that live in torch.nn.functional
TORCH_NN = {"softplus", "logsigmoid", "silu", "gelu"}


def torch_fn(torch, mode):
    if mode in TORCH_NN:
        return getattr(torch.nn.functional, mode)
    return getattr(torch, TORCH_NAME[mode])

PREDICATES = {"lt", "le", "gt", "ge", "eq", "ne"}
LOGICAL = {"logical_not", "logical_and", "logical_or", "logical_xor"}

SHAPES = {
    1: [((),), ((1,),), ((2, 3),), ((3, 1),)],
    2: [((), ()), ((1,), (1,)), ((3, 1), (4,)), ((2, 3), (2, 3)), ((), (2, 3))],
    3: [((), (), ()), ((1,), (1,), (1,)), ((3, 1), (4,), (3, 1)), ((2, 3), (2, 3), (2, 3)),
        ((2, 3), (), (3,))],
}


def arity(row):
    return len(row.grads)


def differentiable(row):
    return any(g is not None for g in row.grads)


def _case_id(row, shapes):
    return f"{row.mode}-" + "x".join(str(list(s)).replace(" ", "") for s in shapes)


ALL = [pytest.param(row, shapes, id=_case_id(row, shapes))
       for row in TABLE for shapes in SHAPES[arity(row)]]
DIFF = [p for p in ALL if differentiable(p.values[0])]
NONDIFF = [p for p in ALL if not differentiable(p.values[0])]


# ---------------------------------------------------------------- sampling
def _away_from_kinks(mode, arrays):
    """True when finite differences (eps 1e-6) cannot cross a kink."""
    if mode in ("abs", "relu", "sign"):
        return np.all(np.abs(arrays[0]) > 0.1)
    if mode in ("maximum", "minimum"):
        x, y = np.broadcast_arrays(*arrays)
        return np.all(np.abs(x - y) > 0.1)
    if mode in ("mod", "floor_div"):
        q = arrays[0] / arrays[1]
        f = q - np.floor(q)
        return np.all((f > 0.05) & (f < 0.95))
    if mode in ("floor", "ceil", "round"):
        f = arrays[0] - np.floor(arrays[0])
        return np.all(np.abs(f - 0.5) > 0.05) and np.all((f > 0.05) & (f < 0.95))
    return True


def sample(row, shapes, rng, dtype=np.float64):
    lo, hi = row.domain
    for _ in range(1000):
        arrays = []
        for i, s in enumerate(shapes):
            if (row.mode == "where" and i == 0) or row.mode in LOGICAL:
                a = rng.random(s) < 0.5
            elif row.mode in PREDICATES:
                # small integers: ties happen, so eq/le/ge are exercised on equality
                a = rng.integers(-2, 3, s).astype(dtype)
            else:
                a = rng.uniform(lo, hi, s).astype(dtype)
            arrays.append(np.asarray(a))
        if _away_from_kinks(row.mode, arrays):
            return arrays
    raise AssertionError(f"could not sample inputs for {row.mode} away from kinks")


def run(mode, *xs):
    return apply(Elemwise(mode), *xs)[0]


# ---------------------------------------------------------------- tests
def test_every_row_has_references():
    modes = [r.mode for r in TABLE]
    assert len(set(modes)) == len(modes), "duplicate modes in the table"
    missing = [m for m in modes if m not in NUMPY_REF or m not in TORCH_NAME]
    assert not missing, f"add NumPy/torch references for {missing}"
    for r in TABLE:
        ref = NUMPY_REF[r.mode]
        nargs = ref.nin if isinstance(ref, np.ufunc) else ref.__code__.co_argcount
        assert nargs == arity(r), f"{r.mode}: reference takes {nargs} inputs, the row {arity(r)}"


@pytest.mark.parametrize("row, shapes", ALL)
def test_values_vs_numpy(row, shapes, rng):
    arrays = sample(row, shapes, rng)
    out = run(row.mode, *[gradcore.Tensor(a) for a in arrays])
    with np.errstate(all="ignore"):
        ref = np.asarray(NUMPY_REF[row.mode](*arrays))
    assert out.shape == ref.shape == np.broadcast_shapes(*shapes)
    assert out.dtype == ref.dtype, f"{row.mode}: dtype {out.dtype}, NumPy {ref.dtype}"
    if ref.dtype == bool:
        np.testing.assert_array_equal(out.numpy(), ref)
    else:
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("row, shapes", DIFF)
def test_gradcheck(row, shapes, rng, h):
    arrays = sample(row, shapes, rng)
    h.check_grads(lambda *xs: run(row.mode, *xs), arrays, second=False)


@pytest.mark.parametrize("row, shapes", DIFF)
def test_gradgradcheck(row, shapes, rng, h):
    arrays = sample(row, shapes, rng)
    from gradcore.testing import gradgradcheck
    assert gradgradcheck(lambda *xs: run(row.mode, *xs), [gradcore.Tensor(a) for a in arrays])


@pytest.mark.parametrize("row, shapes", DIFF)
def test_grads_vs_torch(row, shapes, rng, h, torch):
    arrays = sample(row, shapes, rng)
    tfn = torch_fn(torch, row.mode)
    h.compare(torch, lambda *xs: run(row.mode, *xs), tfn, arrays, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("row, shapes", NONDIFF)
def test_values_vs_torch(row, shapes, rng, h, torch):
    arrays = sample(row, shapes, rng)
    out = run(row.mode, *[gradcore.Tensor(a) for a in arrays])
    ref = torch_fn(torch, row.mode)(*[h.to_torch(torch, a, False) for a in arrays])
    h.assert_close(out.numpy(), ref.numpy(), 1e-12, 1e-12, row.mode)


@pytest.mark.parametrize("row", [r for r in TABLE if not differentiable(r)
                                 and r.out_dtype is None], ids=lambda r: r.mode)
def test_nondifferentiable_row_passes_no_gradient(row, rng, h):
    """A recorded non-differentiable row does not break the backward: the
    input gets only the gradient of the differentiable path (like torch's
    zero gradient for floor/sign)."""
    arrays = sample(row, [(2, 3)] * arity(row), rng)
    _, grads, w = h.gc_vjp(lambda *xs: run(row.mode, *xs) * xs[0], arrays)
    expected = w * NUMPY_REF[row.mode](*arrays)
    h.assert_close(grads[0], expected, 1e-12, 1e-12, "grad of x")


# ---- kinks and ties
@pytest.mark.parametrize("mode", ["maximum", "minimum"])
def test_a_tie_gives_the_gradient_to_the_first_operand(mode, h, torch):
    """MegEngine's Elemwise MAX / MIN grads: x gets g where y <= x (MIN:
    x <= y), y only where it is strictly the extreme (PyTorch splits a tie
    in halves: compared with it away from the ties)."""
    x = np.array([1.0, 2.0, -3.0, 0.5])
    y = np.array([1.0, 1.0, -3.0, 4.0])
    _, grads, w = h.gc_vjp(lambda a, b: run(mode, a, b), [x, y], weight=np.ones(4))
    x_wins = (x >= y) if mode == "maximum" else (x <= y)
    h.assert_close(grads[0], x_wins * 1.0, what="grad x")
    h.assert_close(grads[1], ~x_wins * 1.0, what="grad y")
    apart = x != y
    h.compare(torch, lambda a, b: run(mode, a, b), getattr(torch, mode), [x[apart], y[apart]])


@pytest.mark.parametrize("mode", ["abs", "relu"])
def test_kink_at_zero_like_torch(mode, h, torch):
    x = np.array([-1.0, 0.0, 2.0])
    h.compare(torch, lambda a: run(mode, a), getattr(torch, mode), [x])


@pytest.mark.parametrize("mode", ["floor", "ceil", "round", "sign"])
def test_rounding_gives_a_zero_gradient_like_torch(mode, h, torch):
    # (no halves for round: MegEngine's takes them away from zero, torch's to even)
    x = np.array([-1.5, -0.2, 0.0, 0.7, 2.5]) if mode != "round" else np.array([-1.6, -0.2, 0.0, 0.7, 2.4])
    _, grads, _ = h.gc_vjp(lambda a: run(mode, a), [x])
    assert grads[0] is not None and not grads[0].any()
    h.compare(torch, lambda a: run(mode, a), getattr(torch, mode), [x])


def test_pow_at_zero_base_like_torch(h, torch):
    x = np.array([0.0, 0.0, 2.0, 0.5])
    y = np.array([2.0, 1.0, 3.0, 0.0])
    _, grads, _ = h.gc_vjp(lambda a, b: run("pow", a, b), [x, y])
    assert np.isfinite(grads[1]).all()
    h.compare(torch, lambda a, b: run("pow", a, b), torch.pow, [x, y])


def test_where_broadcast_condition(h, torch):
    c = np.array([[True], [False], [True]])
    x, y = np.arange(4.0), np.array(-1.5)
    h.compare(torch, lambda c, x, y: run("where", c, x, y), torch.where, [c, x, y])


# ---- dtypes
@pytest.mark.parametrize("row", [r for r in TABLE if differentiable(r)], ids=lambda r: r.mode)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype_is_kept(row, dtype, rng, h):
    arrays = sample(row, [(2, 3)] + [(3,)] * (arity(row) - 1), rng, np.dtype(dtype))
    out, grads, _ = h.gc_vjp(lambda *xs: run(row.mode, *xs), arrays)
    assert out.dtype == np.dtype(dtype)
    ref = NUMPY_REF[row.mode](*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays])
    np.testing.assert_allclose(out, ref, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    for a, g in zip(arrays, grads):
        if a.dtype.kind == "f":
            assert g is not None and g.dtype == np.dtype(dtype) and g.shape == a.shape


def test_python_scalar_keeps_float32(h):
    x = np.array([1.0, 2.0], np.float32)
    out, grads, w = h.gc_vjp(lambda t: t * 0.5 + 1, [x])
    assert out.dtype == np.float32 and grads[0].dtype == np.float32
    np.testing.assert_allclose(grads[0], 0.5 * w)


# ---- bad input
@pytest.mark.parametrize("record", [False, True])
def test_broadcast_mismatch_names_op_and_shapes(record, h):
    a = gradcore.Tensor(np.ones((2, 3)))
    b = gradcore.Tensor(np.ones((4,)))
    gm = gradcore.GradManager().attach([a])
    with gm if record else _null():
        with pytest.raises(ValueError) as ei:
            run("add", a, b)
    h.check_error(ei, "add", "(2, 3)", "(4,)")
    with pytest.raises(ValueError) as ei:
        a * b
    h.check_error(ei, "mul", "(2, 3)", "(4,)")


def test_wrong_arity_names_op():
    with pytest.raises(ValueError) as ei:
        run("add", gradcore.Tensor(np.ones(2)))
    assert "add" in str(ei.value)


def test_unknown_mode():
    with pytest.raises(ValueError, match="no_such_mode"):
        Elemwise("no_such_mode")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---- regression test for a core bug, fixed in gradcore/graph.py
def test_symbolic_equality_is_traced():
    from gradcore.core import Op

    class TieMax(Op):     # maximum, written the natural way with ==
        name = "TieMax"

        def infer(self, x, y):
            return (x,)

        def cpu(self, x, y):
            return np.maximum(x, y)

        def vjp(self, inputs, outputs, grads):
            (x, y), (g,) = inputs, grads
            tie = run("where", x == y, g * 0.5, 0)
            return [run("where", x > y, g, tie), None]

    x = gradcore.Tensor(np.array([1.0, 2.0]))
    y = gradcore.Tensor(np.array([1.0, 3.0]))
    gm = gradcore.GradManager().attach([x])
    with gm:
        gm.backward(apply(TieMax(), x, y)[0], gradcore.Tensor(np.ones(2)))
    np.testing.assert_array_equal(x.grad.numpy(), [0.5, 0.0])
