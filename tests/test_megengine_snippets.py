"""MegEngine docstring examples (imperative/python/megengine/functional/{math,tensor}.py,
autodiff/grad_manager.py, autodiff Function), translated mechanically
megengine -> gradcore (``from megengine import Tensor`` -> ``from gradcore import Tensor``,
``import megengine.functional as F`` -> ``import gradcore.functional as F``)."""
import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import gradcore as gc
import gradcore.functional as F
from gradcore import Tensor
from gradcore.autodiff import GradManager, Function


def chk(t, expected, dtype=None, rtol=1e-4, atol=1e-4):
    a = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
    assert_allclose(a, np.asarray(expected), rtol=rtol, atol=atol)
    assert a.shape == np.asarray(expected).shape
    if dtype is not None:
        assert np.dtype(t.dtype) == np.dtype(dtype), t.dtype


# dtypes are MegEngine's documented ones (gradcore.dtypes): an int32 sum,
# prod or cumsum is int32 and an int mean/var/std/norm float32 (NumPy's rules,
# kept here before, gave int64 and float64)
_INT = np.dtype("int32")
_FLOAT = np.dtype("float32")


# ---- functional/math.py ----
def test_isnan():
    chk(F.isnan(Tensor([1, float("nan"), 0])), [False, True, False], "bool")


def test_isinf():
    chk(F.isinf(Tensor([1, float("inf"), 0])), [False, True, False], "bool")


def test_sign():
    chk(F.sign(Tensor([1, -1, 0])), [1, -1, 0], "int32")


def test_sum_examples():
    chk(F.sum(Tensor([1, 2, 3])), 6, _INT)
    chk(F.sum(Tensor([0.5, 1.5])), 2.0, "float32")
    chk(F.sum(Tensor([[1, 2, 3], [4, 5, 6]]), axis=0), [5, 7, 9], _INT)
    chk(F.sum(Tensor([[1, 2, 3], [4, 5, 6]]), axis=1), [6, 15], _INT)


def test_sum_empty():
    chk(F.sum(Tensor([])), 0.0, "float32")


def test_prod_examples():
    chk(F.prod(Tensor([1, 2, 3])), 6, _INT)
    chk(F.prod(Tensor([0.5, 1.5])), 0.75, "float32")
    chk(F.prod(Tensor([[1, 2, 3], [4, 5, 6]]), axis=0), [4, 10, 18], _INT)
    chk(F.prod(Tensor([[1, 2, 3], [4, 5, 6]]), axis=1), [6, 120], _INT)


def test_prod_empty():
    chk(F.prod(Tensor([])), 1.0, "float32")


def test_mean_examples():
    chk(F.mean(Tensor([1, 2, 3])), 2.0, _FLOAT)
    assert np.isnan(F.mean(Tensor([1, np.nan, 3])).numpy())
    chk(F.mean(Tensor([[1, 2, 3], [4, 5, 6]]), axis=0), [2.5, 3.5, 4.5], _FLOAT)
    chk(F.mean(Tensor([[1, 2, 3], [4, 5, 6]]), axis=1), [2.0, 5.0], _FLOAT)


def test_var_std():
    chk(F.var(Tensor([[1, 2], [3, 4]])), 1.25, _FLOAT)
    x = Tensor([[14, 8, 11, 10], [7, 9, 10, 11], [10, 15, 5, 10]])
    chk(F.var(x), 6.8333335, _FLOAT)
    chk(F.std(Tensor([[1, 2], [3, 4]])), 1.118034, _FLOAT)
    chk(F.std(x), 2.6140645, _FLOAT)


def test_min_max():
    x = Tensor([[1, 2], [3, 4]])
    chk(F.min(x), 1, "int32")
    chk(F.min(x, axis=0), [1, 2], "int32")
    chk(F.min(x, axis=1), [1, 3], "int32")
    chk(F.max(x), 4, "int32")
    chk(F.max(x, axis=0), [3, 4], "int32")
    chk(F.max(x, axis=1), [2, 4], "int32")


def test_argmin_argmax():
    x = Tensor(np.arange(1, 7, dtype=np.int32).reshape(2, 3))
    chk(F.argmin(x), 0, "int32")
    chk(F.argmax(x), 5, "int32")


def test_sort():
    x = Tensor(np.array([1, 2], dtype=np.float32))
    out, indices = F.sort(x)
    chk(out, np.array([1.0, 2.0], dtype=np.float32), "float32")


def test_topk():
    x = Tensor(np.array([2, 4, 6, 8, 7, 5, 3, 1], dtype=np.float32))
    top, indices = F.topk(x, 5, descending=False)
    assert_array_equal(top.numpy(), [1.0, 2.0, 3.0, 4.0, 5.0])
    assert_array_equal(indices.numpy(), [7, 0, 6, 1, 5])


def test_matmul():
    data1 = Tensor(np.arange(0, 6, dtype=np.float32).reshape(2, 3))
    data2 = Tensor(np.arange(0, 6, dtype=np.float32).reshape(3, 2))
    chk(F.matmul(data1, data2), [[10.0, 13.0], [28.0, 40.0]], "float32")


def test_dot():
    data1 = Tensor(np.arange(0, 6, dtype=np.float32))
    data2 = Tensor(np.arange(0, 6, dtype=np.float32))
    out = F.dot(data1, data2)
    chk(out, np.array(55.0, dtype=np.float32), "float32")


def test_norm_inf():
    x = Tensor([1, 2, 3])
    chk(F.norm(x, ord=math.inf), 3, "int32")
    chk(F.norm(x, ord=-math.inf), 1, "int32")


def test_norm_axis():
    x = Tensor([[1, 2, 3], [4, 5, 6]])
    chk(F.norm(x, ord=2, axis=0), [4.1231, 5.3852, 6.7082], _FLOAT)
    chk(F.norm(x, ord=2, axis=1), [3.7417, 8.775], _FLOAT)


# ---- functional/tensor.py ----
def test_arange():
    chk(F.arange(5), [0.0, 1.0, 2.0, 3.0, 4.0], "float32")
    chk(F.arange(1, 4), [1.0, 2.0, 3.0], "float32")


def test_linspace():
    chk(F.linspace(1, 10, 10), np.arange(1, 11, dtype=np.float32), "float32")
    chk(F.linspace(2.0, 3.0, 5), [2.0, 2.25, 2.5, 2.75, 3.0], "float32")


def test_eye():
    chk(F.eye(3), np.eye(3), "float32")
    chk(F.eye(4, 6), np.eye(4, 6), "float32")


def test_full():
    chk(F.full((2, 3), 6), [[6, 6, 6], [6, 6, 6]], "int32")


def test_ones_zeros():
    chk(F.ones(5), np.ones(5), "float32")
    chk(F.ones((5,), dtype="int32"), np.ones(5), "int32")
    chk(F.ones((2, 2)), np.ones((2, 2)), "float32")
    chk(F.zeros((2, 3)), np.zeros((2, 3)), "float32")


def test_zeros_like_ones_like():
    x = F.arange(6, dtype="int32").reshape(2, 3)
    chk(F.zeros_like(x), np.zeros((2, 3)), "int32")
    chk(F.ones_like(x), np.ones((2, 3)), "int32")


def test_broadcast_to():
    data = Tensor(np.arange(0, 3, dtype=np.float32).reshape(3))
    chk(F.broadcast_to(data, (2, 3)), [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]], "float32")


def test_concat():
    data1 = Tensor(np.arange(0, 6, dtype=np.float32).reshape((2, 3)))
    data2 = Tensor(np.arange(6, 12, dtype=np.float32).reshape((2, 3)))
    chk(F.concat([data1, data2]), np.arange(12, dtype=np.float32).reshape(4, 3), "float32")


def test_stack():
    x1 = Tensor(np.arange(0, 3, dtype=np.float32).reshape((3)))
    x2 = Tensor(np.arange(6, 9, dtype=np.float32).reshape((3)))
    chk(F.stack([x1, x2], axis=0), [[0.0, 1.0, 2.0], [6.0, 7.0, 8.0]], "float32")


def test_split():
    x = Tensor(np.random.random((10, 20)), dtype=np.float32)
    y = F.split(x, 3)
    z = F.split(x, [6, 17], axis=1)
    assert [i.numpy().shape for i in y] == [(4, 20), (3, 20), (3, 20)]
    assert [i.numpy().shape for i in z] == [(10, 6), (10, 11), (10, 3)]


def test_gather():
    inp = Tensor([[1, 2], [3, 4], [5, 6]])
    index = Tensor([[0, 2], [1, 0]])
    chk(F.gather(inp, 0, index), [[1, 6], [3, 2]], "int32")


def test_scatter():
    inp = Tensor(np.zeros(shape=(3, 5), dtype=np.float32))
    source = Tensor([[0.9935, 0.9465, 0.2256, 0.8926, 0.4396], [0.7723, 0.0718, 0.5939, 0.357, 0.4576]])
    index = Tensor([[0, 2, 0, 2, 1], [2, 0, 1, 1, 2]])
    oup = F.scatter(inp, 0, index, source)
    chk(oup, [[0.9935, 0.0718, 0.2256, 0.0, 0.0],
              [0.0, 0.0, 0.5939, 0.357, 0.4396],
              [0.7723, 0.9465, 0.0, 0.8926, 0.4576]], "float32")


def test_where():
    # the doc uses np.bool (removed in NumPy >= 1.24); np.bool_ is the same type
    mask = Tensor(np.array([[True, False], [False, True]], dtype=np.bool_))
    x = Tensor(np.array([[1, np.inf], [np.nan, 4]], dtype=np.float32))
    y = Tensor(np.array([[5, 6], [7, 8]], dtype=np.float32))
    chk(F.where(mask, x, y), [[1.0, 6.0], [7.0, 4.0]], "float32")


def test_transpose():
    x = Tensor(np.array([[1, 1], [0, 0]], dtype=np.int32))
    chk(F.transpose(x, (1, 0)), [[1, 0], [1, 0]], "int32")


def test_reshape():
    x = F.arange(12)
    chk(F.reshape(x, (3, 4)), np.arange(12).reshape(3, 4), "float32")
    chk(F.reshape(x, (2, -1)), np.arange(12).reshape(2, 6), "float32")


def test_flatten():
    inp_shape = (2, 2, 3, 3)
    x = Tensor(np.arange(36, dtype=np.int32).reshape(inp_shape))
    out = F.flatten(x, 2)
    assert x.numpy().shape == (2, 2, 3, 3)
    assert out.numpy().shape == (2, 2, 9)


def test_expand_dims():
    x = Tensor([1, 2])
    assert F.expand_dims(x, 0).numpy().shape == (1, 2)


def test_squeeze():
    x = Tensor(np.array([1, 2], dtype=np.int32).reshape(1, 1, 2, 1))
    assert F.squeeze(x, 3).numpy().shape == (1, 1, 2)


def test_cumsum():
    x = Tensor([[1, 2, 3], [4, 5, 6]])
    chk(F.cumsum(x, axis=0), [[1, 2, 3], [5, 7, 9]], _INT)
    chk(F.cumsum(x, axis=1), [[1, 3, 6], [4, 9, 15]], _INT)


# ---- autodiff/grad_manager.py (docstring pattern, with concrete f) ----
def test_gradmanager_with_attach_inside():
    with GradManager() as gm:
        x = Tensor([1.0, 2.0, 3.0])
        gm.attach(x)
        y = x * x
        dy = F.ones_like(y)
        gm.backward(y, dy)
        dx = x.grad
    chk(dx, [2.0, 4.0, 6.0])


def test_gradmanager_record_release():
    w = gc.Parameter([2.0])
    gm = GradManager()
    gm.attach([w])
    gm.record()
    loss = (w * 3.0).sum()
    gm.backward(loss)
    chk(w.grad, [3.0])


def test_gradmanager_attach_callbacks_concat():
    x = Tensor([1.0])
    y = Tensor([1.0])
    calls = []

    def f(t, g):
        calls.append("f")
        return g * 2

    def g_(t, g):
        calls.append("g")
        return g * 10

    gm = GradManager()
    gm.attach([x, y], callbacks=[f])
    gm.attach([y], callbacks=[g_])
    with gm:
        gm.backward(x + y)
    chk(x.grad, [2.0])
    chk(y.grad, [20.0])


# ---- autodiff.Function docstring example (Sigmoid) ----
def test_function_sigmoid():
    class Sigmoid(Function):
        def forward(self, x):
            y = 1 / (1 + F.exp(-x))
            self.y = y
            return y

        def backward(self, dy):
            y = self.y
            return dy * y * (1 - y)

    x = Tensor([0.0, 1.0])
    gm = GradManager().attach([x])
    with gm:
        y = Sigmoid()(x)
        gm.backward(y.sum())
    s = 1 / (1 + np.exp(-np.array([0.0, 1.0])))
    chk(y, s)
    chk(x.grad, s * (1 - s))


# ---- functional/nn.py docstring examples ----
def test_relu():
    x = Tensor(np.array([-2, -1, 0, 1, 2]).astype(np.float32))
    chk(F.relu(x), [0.0, 0.0, 0.0, 1.0, 2.0], "float32")


def test_softmax():
    x = Tensor(np.arange(-5, 5, dtype=np.float32)).reshape(2, 5)
    out = F.softmax(x)
    row = [0.0117, 0.0317, 0.0861, 0.2341, 0.6364]
    chk(out.numpy().round(decimals=4), [row, row])


def test_nn_namespace_relu():
    x = Tensor(np.array([-2, -1, 0, 1, 2]).astype(np.float32))
    chk(F.nn.relu(x), [0.0, 0.0, 0.0, 1.0, 2.0], "float32")
