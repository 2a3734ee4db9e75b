"""dtype behaviour: float32 by default, float64 kept, float16 storage,
integer and bool tensors for indices and masks, a deep-learning framework's
promotion rules (gradcore.dtypes; the full grid against PyTorch is in
test_dtype_rules.py)."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager


def test_defaults():
    assert gc.tensor([1.0, 2.0]).dtype == np.float32
    assert gc.tensor(1.5).dtype == np.float32
    assert gc.tensor([1, 2]).dtype == np.int32
    assert gc.tensor([True, False]).dtype == np.bool_
    assert gc.tensor(np.zeros(2, np.float64)).dtype == np.float64     # never silently downcast
    assert gc.tensor(np.zeros(2, np.int64)).dtype == np.int64
    assert gc.tensor([1.0], dtype="float16").dtype == np.float16


# NumPy's rules were kept here before; these are the cases where gradcore's
# rules now differ from them (NumPy's result in the comment)
@pytest.mark.parametrize("a, b, want", [
    ("float32", "float64", "float64"), ("float16", "float32", "float32"),
    ("int32", "float32", "float32"),       # NumPy: float64
    ("int32", "int64", "int64"), ("bool", "int32", "int32"), ("uint8", "int8", "int16"),
    ("float16", "int64", "float16"),       # NumPy: float64
])
def test_binary_promotion(a, b, want):
    x, y = np.ones(3, a), np.ones(3, b)
    assert (gc.tensor(x) + gc.tensor(y)).dtype == want
    assert (gc.tensor(x) * gc.tensor(y)).dtype == want


@pytest.mark.parametrize("dtype, with_float", [("float16", "float16"), ("float32", "float32"),
                                               ("float64", "float64"),
                                               ("int32", "float32")])      # NumPy: float64
def test_python_scalars_are_weak(dtype, with_float):
    x = gc.tensor(np.ones(3, dtype))
    assert (x * 2).dtype == dtype
    assert (x + 1.5).dtype == with_float


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_gradients_keep_the_dtype(dtype):
    x = gc.tensor(np.linspace(0.1, 1, 6).reshape(2, 3).astype(dtype))
    w = gc.tensor(np.ones((3, 2), dtype))
    gm = GradManager().attach([x, w])
    with gm:
        y = F.tanh(F.matmul(x, w)).sum() + (x * x).mean()
        gm.backward(y)
    assert x.grad.dtype == np.dtype(dtype) and w.grad.dtype == np.dtype(dtype)
    assert y.dtype == np.dtype(dtype)


def test_float16_gradients_are_close_to_float32():
    x32 = np.linspace(-1, 1, 8).astype("float32")
    grads = {}
    for dt in ("float16", "float32"):
        x = gc.tensor(x32.astype(dt))
        gm = GradManager().attach(x)
        with gm:
            gm.backward((F.sin(x) * x).sum())
        grads[dt] = x.grad.numpy().astype("float32")
    np.testing.assert_allclose(grads["float16"], grads["float32"], rtol=1e-2, atol=1e-2)


def test_integer_and_bool_tensors_as_indices_and_masks():
    x = gc.tensor(np.arange(12, dtype="float32").reshape(3, 4))
    idx = gc.tensor([2, 0])
    mask = x > 5
    assert mask.dtype == np.bool_
    np.testing.assert_array_equal(x[idx].numpy(), x.numpy()[[2, 0]])
    np.testing.assert_array_equal(x[mask].numpy(), x.numpy()[x.numpy() > 5])
    np.testing.assert_array_equal(F.where(mask, x, 0).numpy(), np.where(x.numpy() > 5, x.numpy(), 0))
    gm = GradManager().attach(x)
    with gm:
        gm.backward((x[mask] * 2).sum() + F.where(mask, x, 0).sum())
    np.testing.assert_array_equal(x.grad.numpy(), np.where(x.numpy() > 5, 3.0, 0.0))


def test_integer_tensors_get_no_gradient():
    x = gc.tensor([1.0, 2.0])
    n = gc.tensor([3, 4])
    # MegEngine: only floating point tensors can be attached
    for bad in (n, gc.tensor([True])):
        with pytest.raises(AssertionError, match=r"only tensors of floating point dtype.*(int32|bool)"):
            GradManager().attach([x, bad])
    gm = GradManager().attach([x])
    with gm:
        gm.backward((x * n).sum())
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])
    assert n.grad is None


def test_true_division_of_integers_is_float32():
    assert (gc.tensor([1, 2]) / gc.tensor([2, 2])).dtype == np.float32      # NumPy: float64
    np.testing.assert_array_equal((gc.tensor([1, 2]) / gc.tensor([2, 2])).numpy(), [0.5, 1.0])
    assert (gc.tensor([1, 2]) // gc.tensor([2, 2])).dtype == np.int32
