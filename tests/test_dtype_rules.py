"""gradcore's dtype rules (gradcore/dtypes.py, table in docs/core.md) against
PyTorch's ``torch.result_type`` on a grid of dtype pairs and Python scalars,
through the real ops (operators, functional, reductions, conv/linear), with
the places where gradcore follows MegEngine instead listed explicitly."""
import itertools

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore import dtypes
from gradcore.autodiff import GradManager

DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"]
SCALARS = [True, 3, 1.5]
# ops that must produce floats: integer and bool inputs give float32
FLOAT_UNARY = {"exp": F.exp, "log": F.log, "sqrt": F.sqrt, "sigmoid": F.sigmoid, "tanh": F.tanh,
               "sin": F.sin, "log1p": F.log1p, "erf": F.erf}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _torch_dtype(torch, name):
    return getattr(torch, name)


def _name(dtype):
    return str(dtype).replace("torch.", "")


def _sample(dtype, shape=(3,)):
    """Positive values every dtype holds (so log, sqrt, pow are defined)."""
    return (np.arange(1, 1 + int(np.prod(shape))).reshape(shape) % 2 == 1).astype(dtype) \
        if dtype == "bool" else (np.arange(1, 1 + int(np.prod(shape))).reshape(shape) % 5 + 1).astype(dtype)


@pytest.mark.parametrize("a, b", list(itertools.product(DTYPES, DTYPES)), ids=lambda d: d)
def test_tensor_pairs_match_torch_result_type(torch, a, b):
    want = _name(torch.result_type(torch.zeros(3, dtype=_torch_dtype(torch, a)),
                                   torch.zeros(3, dtype=_torch_dtype(torch, b))))
    assert str(dtypes.promote_types(a, b)) == want
    x, y = gc.tensor(_sample(a)), gc.tensor(_sample(b))
    assert str((x * y).dtype) == want
    assert str(F.maximum(x, y).dtype) == want
    assert (x < y).dtype == np.bool_
    if "bool" not in (a, b):
        assert str((x + y).dtype) == want and str((x - y).dtype) == want
    # true division (and pow, see below) always gives floats: the pair's dtype, at least float32
    ones = gc.tensor(np.ones(3, b))
    assert (x / ones).dtype == dtypes.float_dtype(want)
    np.testing.assert_allclose((x / ones).numpy(), _sample(a).astype("float64"), rtol=1e-3)


@pytest.mark.parametrize("a", DTYPES)
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
def test_tensor_with_python_scalar_matches_torch_but_python_ints_are_int32(torch, a, scalar):
    want = _name(torch.result_type(torch.zeros(3, dtype=_torch_dtype(torch, a)), scalar))
    if a == "bool" and type(scalar) is int:
        want = "int32"          # MegEngine: a Python int is int32 (PyTorch: int64)
    x = gc.tensor(_sample(a))
    assert str(dtypes.result_type(x, scalar)) == want
    assert str((x * scalar).dtype) == want and str((scalar * x).dtype) == want
    assert str(F.maximum(x, scalar).dtype) == want
    # NumPy scalars are weak too: np.float64(2.0) does not turn float32 into float64
    assert str((x * np.asarray(scalar)[()]).dtype) == want


@pytest.mark.parametrize("a", DTYPES)
@pytest.mark.parametrize("name", sorted(FLOAT_UNARY))
def test_ops_that_must_produce_floats_give_float32_for_integers_and_bool(torch, a, name):
    fn = FLOAT_UNARY[name]
    x = _sample(a)
    y = fn(gc.tensor(x))
    tfn = getattr(torch, name) if hasattr(torch, name) else getattr(torch.special, name)
    ref = tfn(torch.tensor(x))
    assert str(y.dtype) == _name(ref.dtype)
    assert y.dtype == dtypes.float_dtype(a)
    tol = 2e-3 if a == "float16" else 1e-6
    np.testing.assert_allclose(y.numpy().astype("float64"), ref.double().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("a", DTYPES)
def test_reductions(torch, a):
    x = gc.tensor(_sample(a, (2, 3)))
    tx = torch.tensor(_sample(a, (2, 3)))
    # mean: floats from integers and bool (PyTorch refuses them), float dtypes kept
    assert x.mean().dtype == dtypes.float_dtype(a) and F.mean(x, axis=1).dtype == dtypes.float_dtype(a)
    np.testing.assert_allclose(x.mean().numpy(), _sample(a, (2, 3)).astype("float64").mean(), rtol=1e-3)
    # sum and prod: MegEngine's rule, integers keep their dtype, bool counts in int32
    # (PyTorch and NumPy widen both to int64); floats as PyTorch
    want = {"bool": "int32"}.get(a, a)
    for got in (x.sum(), F.sum(x, axis=0), F.prod(x, axis=1)):
        assert str(got.dtype) == want
    if a.startswith("float"):
        assert str(x.sum().dtype) == _name(tx.sum().dtype)
    np.testing.assert_array_equal(x.sum().numpy(), _sample(a, (2, 3)).astype("float64").sum())
    # max and min keep the dtype, as PyTorch
    assert str(F.max(x, axis=1).dtype) == _name(tx.amax(1).dtype) == a
    # norm, normalize, var, softmax: floats
    for got in (F.norm(x, axis=1), F.normalize(x, axis=1), F.var(x, axis=1), F.softmax(x, axis=1)):
        assert got.dtype == dtypes.float_dtype(a)


@pytest.mark.parametrize("a, b", [(a, b) for a, b in itertools.product(DTYPES, DTYPES)
                                  if "bool" not in (a, b)], ids=lambda d: d)
def test_pow_is_float_as_in_megengine(torch, a, b):
    """MegEngine computes pow in float32 when both inputs are integers
    (PyTorch keeps the integer dtype); with a float input, as PyTorch."""
    x, y = _sample(a), _sample(b)
    got = gc.tensor(x) ** gc.tensor(y)
    want = _name(torch.result_type(torch.tensor(x), torch.tensor(y)))
    assert got.dtype == dtypes.float_dtype(want)
    np.testing.assert_allclose(got.numpy().astype("float64"), x.astype("float64") ** y, rtol=2e-3)


def test_rounding_integers_keeps_them(torch):
    x = np.array([-3, 0, 7], "int32")
    for fn, tfn in ((F.floor, torch.floor), (F.ceil, torch.ceil), (F.round, torch.round)):
        y = fn(gc.tensor(x))
        assert y.dtype == np.int32 and str(y.dtype) == _name(tfn(torch.tensor(x)).dtype)
        np.testing.assert_array_equal(y.numpy(), x)


def test_bool_arithmetic_that_numpy_and_torch_refuse_is_a_type_error_naming_the_op():
    t = gc.tensor([True, False])
    for expr, op in ((lambda: t - t, "sub"), (lambda: -t, "neg"), (lambda: t // t, "floor_div")):
        with pytest.raises(TypeError, match=op):
            expr()


def test_defaults():
    assert gc.tensor(1.5).dtype == np.float32 and gc.tensor([1.5, 2]).dtype == np.float32
    assert gc.tensor(3).dtype == np.int32 and gc.tensor([1, 2]).dtype == np.int32
    assert F.zeros((2,)).dtype == np.float32 and F.ones((2,)).dtype == np.float32
    assert F.arange(3.0).dtype == np.float32 and F.linspace(0, 1, 3).dtype == np.float32


@pytest.mark.parametrize("wx, ww", [("float16", "float32"), ("float32", "float16"),
                                    ("float32", "float64"), ("float16", "float16")])
def test_linear_matmul_and_conv_promote_mixed_float_widths(torch, wx, ww):
    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(2, 3, 5, 5)).astype(wx)
    w_np = rng.normal(size=(4, 3, 3, 3)).astype(ww)
    want = dtypes.promote_types(wx, ww)
    x, w = gc.tensor(x_np), gc.tensor(w_np)
    gm = GradManager().attach([x, w])
    with gm:
        y = F.conv2d(x, w)
        gm.backward(y.sum())
    assert y.dtype == want
    ref = torch.nn.functional.conv2d(torch.tensor(x_np.astype("float64")), torch.tensor(w_np.astype("float64")))
    tol = 1e-2 if "float16" in (wx, ww) else 1e-5
    np.testing.assert_allclose(y.numpy().astype("float64"), ref.numpy(), rtol=tol, atol=tol)
    # the gradient of each input comes back in that input's own dtype
    assert x.grad.dtype == np.dtype(wx) and w.grad.dtype == np.dtype(ww)

    a, m = gc.tensor(x_np[0, 0]), gc.tensor(w_np[0, 0, :, :].T.copy())
    lin_w, lin_b = gc.tensor(w_np[0, 0]), gc.tensor(w_np[0, 0, 0])
    assert F.matmul(a[:, :3], m).dtype == want
    assert F.linear(a[:, :3], lin_w, lin_b).dtype == want


def test_gradients_through_promotion_come_back_in_each_inputs_dtype():
    h = gc.tensor(np.array([1.0, 2.0], "float16"))
    s = gc.tensor(np.array([3.0, 4.0], "float32"))
    d = gc.tensor(np.array([5.0, 6.0], "float64"))
    gm = GradManager().attach([h, s, d])
    with gm:
        y = (h * s + d * h) / s
        gm.backward(y.sum())
    assert y.dtype == np.float64
    assert (h.grad.dtype, s.grad.dtype, d.grad.dtype) == (np.float16, np.float32, np.float64)
    np.testing.assert_allclose(h.grad.numpy(), 1 + np.array([5.0, 6.0]) / [3.0, 4.0], rtol=1e-3)
    np.testing.assert_allclose(d.grad.numpy(), np.array([1.0, 2.0]) / [3.0, 4.0])


def test_higher_order_gradient_with_mixed_dtypes():
    x = gc.tensor(np.array([0.5, 1.5], "float32"))
    n = gc.tensor(np.array([2, 3], "int32"))
    outer, inner = GradManager().attach(x), GradManager().attach(x)
    with outer:
        with inner:
            y = (x ** n / n).sum()           # d/dx = x ** (n - 1); d2/dx2 = (n - 1) x ** (n - 2)
            inner.backward(y)
        g = x.grad
        x.grad = None
        outer.backward(g.sum())
    assert g.dtype == np.float32 and x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 2 * 1.5], rtol=1e-6)


def test_unsupported_dtypes_are_refused_by_name():
    with pytest.raises(TypeError, match="promote_types"):
        dtypes.promote_types("float32", "complex64")
    with pytest.raises(TypeError, match="no integer dtype holds both"):
        dtypes.promote_types("uint64", "int8")
