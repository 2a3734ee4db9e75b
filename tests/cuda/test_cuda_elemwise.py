"""CUDA launcher of the elementwise ops (ops/elemwise.py): every row of the
table against the cpu (values; first- and second-order gradients for the
differentiable rows, inputs in each row's domain), broadcasting, 0-d, size-1
and empty shapes, float64, integer and bool inputs, and NumPy's semantics
where C's differ (NaN, floor division, modulo, powers, rounding)."""
import warnings

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.ops.elemwise import TABLE, Elemwise

DIFF = [r for r in TABLE if r.grads is not None and any(g is not None for g in r.grads)]
NONDIFF = [r for r in TABLE if r not in DIFF]
INT_MODES = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "floor_div", "mod", "neg", "abs", "sign",
             "square", "floor", "ceil", "round", "lt", "le", "gt", "ge", "eq", "ne", "logical_not",
             "logical_and", "logical_or", "logical_xor", "relu", "sqrt", "exp", "sigmoid"]


def _apply(mode):
    op = Elemwise(mode)
    return lambda *ts: gc.core.apply(op, *ts)[0]


def _inputs(row, shapes, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    lo, hi = row.domain
    arrays = [rng.uniform(lo, hi, s).astype(dtype) for s in shapes]
    if row.mode == "where":
        arrays[0] = rng.uniform(-1, 1, shapes[0]) > 0
    return arrays


def _host_run(be, mode, *arrays):
    """(cuda result, cpu result) of one elementwise op, as ndarrays."""
    op = Elemwise(mode)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        want = np.asarray(op.cpu(*arrays))
    got = op.cuda(be, *[be.to_device(np.asarray(a)) for a in arrays]).get()
    assert got.dtype == want.dtype and got.shape == want.shape, (mode, got.dtype, want.dtype)
    return got, want


def _same(got, want, rtol=0.0):
    """Bitwise-equal up to NaN payloads: values, infinities, signed zeros
    (``rtol``: close, for transcendental functions)."""
    if rtol:
        np.testing.assert_allclose(got, want, rtol=rtol, equal_nan=True)
    elif want.dtype.kind == "f":
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got[ok], want[ok])
        np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("row", DIFF, ids=lambda r: r.mode)
def test_differentiable_rows(cuda, matches_cpu, row):
    n = len(row.grads)
    arrays = _inputs(row, [(3, 4)] * n)
    matches_cpu(_apply(row.mode), arrays, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("row", NONDIFF, ids=lambda r: r.mode)
def test_other_rows(cuda, matches_cpu, row):
    n = 1 if row.grads is None else len(row.grads)
    rng = np.random.default_rng(1)
    arrays = [(rng.integers(-4, 5, (3, 4)) * 0.5).astype(np.float32) for _ in range(n)]   # ties, halves, zeros
    if row.mode in ("floor_div",):
        arrays[1][arrays[1] == 0] = 1.5
    matches_cpu(_apply(row.mode), arrays)


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.mode)
def test_rows_float64(cuda, matches_cpu, row):
    n = 1 if row.grads is None else len(row.grads)
    arrays = _inputs(row, [(2, 3)] * n, np.float64, seed=3)
    matches_cpu(_apply(row.mode), arrays, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shapes", [[(3, 1), (1, 4)], [(), (2, 3)], [(2, 3), ()], [(2, 1, 3), (3,)],
                                    [(1,), (2, 3)], [(4,), (1, 1)], [(), ()], [(1,), (1,)]],
                         ids=str)
def test_broadcasting(cuda, matches_cpu, shapes):
    for mode in ("add", "sub", "mul", "div", "pow", "maximum", "mod"):
        row = Elemwise(mode).row
        matches_cpu(_apply(mode), _inputs(row, shapes, seed=4))
    matches_cpu(lambda a, b: F.tanh(a * b) + F.exp(b - a), _inputs(Elemwise("add").row, shapes, seed=5))


@pytest.mark.parametrize("shapes", [[(0,), (0,)], [(0, 3), (3,)], [(2, 0), (1,)], [(0, 3), ()], [(2, 1, 0), (3, 1)]],
                         ids=str)
def test_empty(cuda, matches_cpu, shapes):
    for mode in ("add", "mul", "pow", "maximum", "lt"):
        matches_cpu(_apply(mode), _inputs(Elemwise(mode).row, shapes))
    matches_cpu(lambda a: F.sin(a) * 2, _inputs(Elemwise("sin").row, shapes[:1]))


def test_unary_shapes(cuda, matches_cpu):
    for shape in ((), (1,), (1, 1), (5,), (2, 0, 3)):
        for mode in ("exp", "tanh", "gelu", "abs"):
            matches_cpu(_apply(mode), _inputs(Elemwise(mode).row, [shape]))


def test_where(cuda, matches_cpu):
    rng = np.random.default_rng(6)
    c = rng.uniform(-1, 1, (3, 4)) > 0
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    matches_cpu(lambda c_, x, y: F.where(c_, x * x, F.sin(y)), [c, a, b])
    # broadcasting condition and branches, 0-d ones
    matches_cpu(lambda c_, x, y: F.where(c_, x, y), [c[:, :1], a[:1], np.float32(2.5)])
    matches_cpu(lambda c_, x, y: F.where(c_, x, y), [np.asarray(True), a, b])
    matches_cpu(lambda c_, x, y: F.where(c_, x, y), [c[:0], a[:0], b[0]])
    # a non-bool condition is truth-tested (NaN is true), as by NumPy
    be = cuda
    cond = np.array([0.0, -0.0, 1.5, np.nan, -2.0], np.float32)
    _same(*_host_run(be, "where", cond, np.arange(5.0), -np.arange(5.0)))
    _same(*_host_run(be, "where", np.array([0, 3, -1, 0], np.int32), np.arange(4), np.int64(-7)))
    _same(*_host_run(be, "where", np.array([True, False]), np.array([1, 2], np.int32), np.array([0.5], np.float32)))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8, np.bool_])
def test_integer_and_bool_inputs(cuda, dtype):
    be = cuda
    rng = np.random.default_rng(7)
    if dtype == np.bool_:
        a, b = rng.integers(0, 2, (3, 4)).astype(bool), rng.integers(0, 2, (4,)).astype(bool)
    elif dtype == np.uint8:
        a, b = rng.integers(0, 20, (3, 4)).astype(dtype), rng.integers(0, 6, (4,)).astype(dtype)
    else:
        a, b = rng.integers(-9, 10, (3, 4)).astype(dtype), rng.integers(-4, 5, (4,)).astype(dtype)
    for mode in INT_MODES:
        op = Elemwise(mode)
        args = [a, b][:op.nin]
        if mode == "pow":
            args = [a, np.abs(b).astype(dtype)]
        try:
            # gradcore's dtype rules refuse bool // bool, NumPy bool negative
            op.infer(*[gc.op.TensorDesc(x.shape, x.dtype) for x in args])
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                want = op.cpu(*args)
        except TypeError as exc:            # the same error on cuda, before any kernel
            with pytest.raises(type(exc)):
                op.cuda(be, *[be.to_device(x) for x in args])
            continue
        if np.asarray(want).dtype == np.float16:
            continue                        # test_float16_results_raise
        _same(*_host_run(be, mode, *args), rtol=1e-12 if mode in ("sqrt", "exp", "sigmoid") else 0.0)


def test_mixed_dtypes(cuda, matches_cpu):
    be = cuda
    i32, f32 = np.arange(-3, 3, dtype=np.int32), np.linspace(-1.5, 1.5, 6, dtype=np.float32)
    for mode in ("add", "mul", "div", "maximum", "lt", "floor_div", "mod"):
        _same(*_host_run(be, mode, i32, f32))           # int32 with float32: float64, as NumPy
        _same(*_host_run(be, mode, f32, np.float64(0.75)))
        _same(*_host_run(be, mode, np.uint8(3), i32))
    # through tensors, gradients flow to the float input only; a float64
    # gradient reaches the float32 backward of sin (mixed precision)
    matches_cpu(lambda x, k: x * k + F.sin(x) / (k * k + 1), [f32, i32])
    matches_cpu(lambda x, k: F.sin(x) * k, [f32, i32])


def test_python_scalars(cuda, matches_cpu):
    x = np.random.default_rng(8).uniform(0.5, 1.5, (2, 3)).astype(np.float32)
    matches_cpu(lambda t: (t * 2 - 1) ** 2 / 3 + 2 ** t, [x])
    matches_cpu(lambda t: F.maximum(t, 1.0) + F.minimum(0.8, t) + (t > 1) * t, [x])


def test_floor_div_mod_semantics(cuda):
    # Python's signs, x / 0, infinities, NaN, signed zeros; NumPy's npy_divmod for floats
    be = cuda
    v = np.array([-7.5, -3.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 3.0, 7.5, 0.1, 1e30, np.inf, -np.inf, np.nan])
    a, b = (g.ravel() for g in np.meshgrid(v, v, indexing="ij"))
    for dtype in (np.float32, np.float64):
        for mode in ("floor_div", "mod"):
            _same(*_host_run(be, mode, a.astype(dtype), b.astype(dtype)))
    _same(*_host_run(be, "floor_div", np.float64(1.0), np.float64(0.1)))     # 9.0, not floor(1 / 0.1) = 10
    for dtype in (np.int8, np.int32, np.int64, np.uint8):
        info = np.iinfo(dtype)
        iv = np.array([info.min, info.min + 1, 0, 1, 2, 3, 7, info.max] + ([-1, -2, -3, -7] if info.min else []), dtype)
        ia, ib = (g.ravel() for g in np.meshgrid(iv, iv, indexing="ij"))
        for mode in ("floor_div", "mod"):
            _same(*_host_run(be, mode, ia, ib))                  # x // 0 is 0; MIN // -1 wraps, no trap


def test_pow_semantics(cuda):
    be = cuda
    base = np.array([-2.0, -1.5, -1.0, -0.0, 0.0, 0.5, 2.0, np.inf, -np.inf, np.nan])
    expo = np.array([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, np.inf, np.nan])
    a, b = (g.ravel() for g in np.meshgrid(base, expo, indexing="ij"))
    for dtype in (np.float32, np.float64):
        got, want = _host_run(be, "pow", a.astype(dtype), b.astype(dtype))
        np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)   # (-2) ** 3 = -8, (-2) ** 0.5 = nan
    for dtype in (np.int8, np.int32, np.int64, np.uint64):
        info = np.iinfo(dtype)
        ia, ib = (g.ravel() for g in np.meshgrid(np.array([info.min, -3, -1, 0, 1, 2, 7, info.max] if info.min else
                                                          [0, 1, 2, 7, info.max], dtype),
                                                 np.array([0, 1, 2, 3, 31, 64], dtype), indexing="ij"))
        _same(*_host_run(be, "pow", ia, ib))                     # wraps like NumPy's integer powers
    _same(*_host_run(be, "pow", np.array([True, False]), np.array([True])))
    with pytest.raises(ValueError, match="negative integer powers"):
        Elemwise("pow").cuda(be, be.to_device(np.arange(3)), be.to_device(np.array([2, -1, 0])))
    # a float exponent: float64; CUDA's double pow is within 2 ULP (the CUDA C Programming Guide's table),
    # NumPy's within 1: sqrt(2) differs in its last bit on a GPU
    got, want = _host_run(be, "pow", np.arange(3), np.array([2.0, -1.0, 0.5]))
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_array_max_ulp(got, want, maxulp=2)


def test_nan_and_rounding_semantics(cuda):
    be = cuda
    v = np.array([np.nan, -np.inf, -2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 3.5, np.inf, 1e-30], np.float32)
    a, b = (g.ravel() for g in np.meshgrid(v, v, indexing="ij"))
    for mode in ("maximum", "minimum", "lt", "ne", "logical_and", "logical_xor"):
        _same(*_host_run(be, mode, a, b))                        # NaN propagates; -0.0 vs 0.0 as NumPy
    for mode in ("relu", "sign", "abs", "round", "floor", "ceil", "neg", "logical_not", "softplus", "logsigmoid"):
        _same(*_host_run(be, mode, v))
    for mode in ("sigmoid", "silu", "gelu", "erf", "exp", "tanh"):
        got, want = _host_run(be, mode, v.astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300, equal_nan=True)
    _same(*_host_run(be, "logical_xor", np.array([2, 0, -1, 0]), np.array([1, 3, 0, 0])))   # truth values, not !=


def test_float16_results_raise(cuda):
    # NumPy computes sqrt of int8 in float16; cuda has no float16 kernels: a clear error, no kernel run
    be = cuda
    for dtype in (np.int8, np.uint8, np.bool_):
        with pytest.raises(TypeError, match="float16"):
            Elemwise("sqrt").cuda(be, be.to_device(np.ones(3, dtype)))
    with pytest.raises(TypeError, match="float16"):
        Elemwise("add").cuda(be, be.to_device(np.ones(3, np.float16)), be.to_device(np.ones(3, np.float16)))


def test_bad_inputs_raise_like_cpu(cuda):
    be = cuda
    a, b = be.to_device(np.ones((2, 3), np.float32)), be.to_device(np.ones((4,), np.float32))
    with pytest.raises(gc.op.OpError, match="broadcast"):
        Elemwise("add").cuda(be, a, b)
    with pytest.raises(gc.op.OpError, match="takes 2 inputs"):
        Elemwise("add").cuda(be, a)
    t = gc.Tensor(np.ones(2, bool), device="cuda")
    with pytest.raises(TypeError):
        -t


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_takes_halves_away_from_zero_on_cuda_too(cuda, dtype):
    x = np.array([1.5, 2.5, -0.5, -2.5, 0.4, -0.0, np.inf, np.nan], dtype)
    got = F.round(gc.tensor(x, device="cuda")).numpy()
    np.testing.assert_array_equal(got, F.round(gc.tensor(x)).numpy())
    np.testing.assert_array_equal(got, np.array([2, 3, -1, -3, 0, -0.0, np.inf, np.nan], dtype))
