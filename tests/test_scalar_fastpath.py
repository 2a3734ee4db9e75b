"""Python scalars converted in C on the dispatch path (issue 25, item 4): the
same values, dtypes and gradients as the slow path (NumPy scalars still take
the slow path, so they are the reference here)."""
import warnings

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager

FORMS = [
    ("x * c", lambda x, c: x * c),
    ("c * x", lambda x, c: c * x),
    ("c - x", lambda x, c: c - x),
    ("x / c", lambda x, c: x / c),
    ("x ** c", lambda x, c: x ** c),
    ("maximum", lambda x, c: F.maximum(x, c)),
    ("where", lambda x, c: F.where(x > 0, x, c)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int8", "bool"])
@pytest.mark.parametrize("value", [0.5, 2, -3, 1e30, 0.0, -0.0, 7.25])
@pytest.mark.parametrize("name,form", FORMS)
def test_same_as_the_slow_path(dtype, value, name, form):
    if dtype == "bool" and name in ("c - x", "x ** c", "x / c") or (dtype in ("int32", "int8") and name == "x ** c"):
        pytest.skip("not defined for these operands")
    x = gc.Tensor(np.array([1.5, -2.0, 3.0, 0.25], dtype) if dtype != "bool" else np.array([1, 0, 1, 1], bool))
    ref_value = np.float64(value) if isinstance(value, float) else np.int64(value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, want = form(x, value), form(x, ref_value)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_float32_overflow_warns_as_numpy():
    x = gc.tensor([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="overflow"):
        y = x * 1e300
    assert np.isinf(y.numpy()).all()


def test_huge_int_and_nan():
    x = gc.tensor([1.0, 2.0])
    assert ((x * 2 ** 70).numpy() == np.float32(2.0 ** 70) * np.array([1, 2], np.float32)).all()
    assert np.isnan((x * float("nan")).numpy()).all()
    assert ((x * -0.0).numpy() == 0).all() and np.signbit((x * -0.0).numpy()).all()


def test_many_values_share_the_table():
    """More values than table entries: every result still has its own value."""
    x = gc.tensor(np.ones(3, np.float32))
    for k in range(300):
        v = k * 0.37 - 40
        np.testing.assert_array_equal((x * v).numpy(), np.float32(v) * np.ones(3, np.float32))
        np.testing.assert_array_equal((x + k).numpy(), np.float32(k) + np.ones(3, np.float32))


def test_gradients_and_constants_untouched():
    x = gc.Parameter(np.array([1.0, -2.0, 3.0], np.float32))
    gm = GradManager().attach([x])
    for _ in range(3):
        x.grad = None
        with gm:
            y = F.maximum(1 - (0.5 * x) ** 2 / 2, 0.0)
            gm.backward(F.sum(y * 3))
        xv = x.numpy().astype(np.float64)
        inner = 1 - (0.5 * xv) ** 2 / 2
        want = np.where(inner > 0, 3 * (-(0.5 * xv) * 0.5), 0.0)
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-6)
        assert x.grad.dtype == np.float32
    # the shared constants did not change
    np.testing.assert_array_equal((gc.tensor([2.0]) * 0.5).numpy(), [1.0])


def test_inplace_operators_rebind():
    x = gc.tensor([1.0, 2.0])
    before = x.numpy()
    x *= 0.5
    x += 1
    np.testing.assert_array_equal(x.numpy(), [1.5, 2.0])
    np.testing.assert_array_equal(before, [1.0, 2.0])     # a new value, the old buffer unwritten
    np.testing.assert_array_equal((gc.tensor([4.0]) * 0.5).numpy(), [2.0])


def test_higher_order_through_a_scalar():
    x = gc.Parameter(np.array([1.5, -0.5], np.float32))
    outer, inner = GradManager().attach([x]), GradManager().attach([x])
    with outer:
        with inner:
            y = F.sum(0.5 * x ** 3)
            inner.backward(y)
        g = x.grad                     # 1.5 x^2
        x.grad = None
        outer.backward(F.sum(g))       # 3 x
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.array([1.5, -0.5], np.float32), rtol=1e-6)
