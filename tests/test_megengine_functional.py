"""MegEngine's own functional unit tests, re-expressed for gradcore.

The cases (inputs, shapes, arguments) follow MegEngine's
``imperative/python/test/unit/functional/`` test_tensor.py, test_math.py,
test_elemwise.py, test_functional.py and test_loss.py, plus the argument
sets of its ``unit/xla/functional`` test_xla_nn.py, test_xla_normalize.py,
test_xla_math.py and test_xla_indexing.py (there they compare two backends;
here the expected values are computed independently). Expected values come
from NumPy or PyTorch, never from gradcore; differentiable ops also have
their gradient checked (against torch's autograd, or a closed form).

Where gradcore deliberately differs from MegEngine the test says so:
NumPy's dtype rules (int / int is float64, an int sum is int64, float64
arrays stay float64), so those cases compare values, not dtypes.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore import Tensor
from gradcore.autodiff import GradManager


# ---------------------------------------------------------------- helpers
def _float(a) -> bool:
    return np.asarray(a).dtype.kind == "f"


def gc_vjp(fn, arrays, dy=None, seed=0):
    """gradcore: (value, [grad or None per input], dy). Every floating
    input is attached; ``dy`` defaults to a fixed random weight."""
    xs = [Tensor(np.asarray(a)) for a in arrays]
    gm = GradManager().attach([x for x in xs if x.dtype.kind == "f"])
    with gm:
        y = fn(*xs)
        if dy is None:
            dy = np.random.default_rng(seed).standard_normal(y.shape)
        dy = np.asarray(dy, y.dtype)
        gm.backward(y, Tensor(dy))
    return y.numpy(), [None if x.grad is None else x.grad.numpy() for x in xs], dy


def torch_vjp(torch, tfn, arrays, dy):
    """torch in float64 on the same values: (value, [grad or None])."""
    ts = []
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            ts.append(torch.tensor(a.astype(np.float64), requires_grad=True))
        elif a.dtype.kind in "iu":
            ts.append(torch.tensor(a.astype(np.int64)))
        else:
            ts.append(torch.tensor(a))
    y = tfn(*ts)
    y.backward(torch.tensor(np.asarray(dy, np.float64)))
    return y.detach().numpy(), [None if t.grad is None else t.grad.numpy() for t in ts]


def check_vs_torch(torch, gfn, tfn, arrays, rtol=1e-4, atol=1e-5, seed=0):
    """gradcore's value and the gradients of every floating input agree
    with torch's (computed in float64)."""
    out, grads, dy = gc_vjp(gfn, arrays, seed=seed)
    t_out, t_grads = torch_vjp(torch, tfn, arrays, dy)
    assert out.shape == t_out.shape, (out.shape, t_out.shape)
    np.testing.assert_allclose(out, t_out, rtol=rtol, atol=atol, err_msg="value")
    for i, (g, tg) in enumerate(zip(grads, t_grads)):
        if not _float(arrays[i]):
            continue
        assert g is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(g, tg, rtol=rtol, atol=atol, err_msg=f"gradient of input {i}")
    return out, grads


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).random(shape) * scale).astype(np.float32)


def randn(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ==================================================================== test_tensor.py
@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
@pytest.mark.parametrize("shape", [[10, 20], [30]])
def test_eye_takes_sizes_a_shape_list_or_a_shape_tensor(dtype, shape):
    want = np.eye(*shape).astype(dtype)
    for got in (F.eye(shape, dtype=dtype), F.eye(*shape, dtype=dtype), F.eye(Tensor(shape), dtype=dtype)):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got.numpy(), want)


def test_eye_of_a_tensor_shape_and_full_on_a_device():
    x = Tensor([1, 2, 3], dtype="float32")
    np.testing.assert_array_equal(F.eye(x.shape, dtype="float32").numpy(), np.eye(3, dtype=np.float32))
    np.testing.assert_array_equal(F.eye(x.shape, dtype="float32", device=None).numpy(),
                                  F.eye(x.shape, dtype="float32", device=x.device).numpy())
    np.testing.assert_array_equal(F.full((3, 2), 4, device=x.device).numpy(), np.full((3, 2), 4))


@pytest.mark.parametrize("k", range(-2, 3))
@pytest.mark.parametrize("shape", [(10, 10), (6, 9), (8, 7), (8,)])
def test_diag(shape, k, torch):
    x = rand(*shape, seed=len(shape) + k + 5)
    np.testing.assert_array_equal(F.diag(Tensor(x), k=k).numpy(), np.diag(x, k))
    check_vs_torch(torch, lambda t: F.diag(t, k=k), lambda t: torch.diag(t, k), [x])


@pytest.mark.parametrize("value", [True, 4, 5.0])
def test_full_dtype_follows_the_value(value):
    out = F.full((2, 3), value)
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), value))
    assert out.dtype == Tensor(value).dtype


def test_cumsum_int32_and_its_gradient(torch):
    y = F.cumsum(Tensor([[1, 2, 3], [4, 5, 6]], np.int32), -1)
    # values as MegEngine; the dtype is NumPy's (an int cumsum accumulates in int64)
    np.testing.assert_array_equal(y.numpy(), [[1, 3, 6], [4, 9, 15]])
    assert y.dtype.kind == "i"
    check_vs_torch(torch, lambda t: F.cumsum(t, -1), lambda t: torch.cumsum(t, -1), [randn(2, 3)])


def test_concat(torch):
    d1, d2, d3 = rand(5, 2, 3, seed=1), rand(6, 2, 3, seed=2), rand(7, 2, 3, seed=3)
    for a, b in [(d1, d2), (d1, d3)]:
        np.testing.assert_array_equal(F.concat([Tensor(a), Tensor(b)]).numpy(), np.concatenate([a, b]))
        check_vs_torch(torch, lambda x, y: F.concat([x, y]), lambda x, y: torch.cat([x, y]), [a, b])
    x1 = Tensor(np.arange(0, 6, dtype=np.float32).reshape((2, 3)))
    x2 = Tensor(np.arange(6, 12, dtype=np.float32).reshape((2, 3)))
    np.testing.assert_array_equal(F.concat([x1, x2], axis=-1).numpy(),
                                  [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]])


def test_cond_take_values_and_flat_indices():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    mask = np.array([[True, False, True], [False, True, True]])
    val, idx = F.cond_take(Tensor(mask), Tensor(x))
    np.testing.assert_array_equal(val.numpy(), x[mask])
    np.testing.assert_array_equal(idx.numpy(), np.flatnonzero(mask))


@pytest.mark.parametrize("shape", [(3, 3, 3), (0,), (3, 0, 3)])
def test_cond_take_random_and_empty(shape):
    x = randn(*shape, seed=7)
    mask = x > 0
    val, idx = F.cond_take(Tensor(mask), Tensor(x))
    np.testing.assert_array_equal(val.numpy(), x[mask])
    np.testing.assert_array_equal(idx.numpy(), np.flatnonzero(mask))


def test_cond_take_gradient_scatters_back():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    mask = np.array([[True, False, True], [False, True, True]])
    out, (g,), dy = gc_vjp(lambda t: F.cond_take(Tensor(mask), t)[0], [x])
    want = np.zeros_like(x)
    want[mask] = dy
    np.testing.assert_allclose(g, want)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_stack(axis, torch):
    d1, d2, d3 = rand(3, 2, 2, seed=1), rand(3, 2, 2, seed=2), rand(3, 2, 2, seed=3)
    for a, b in [(d1, d2), (d1, d3)]:
        np.testing.assert_array_equal(F.stack([Tensor(a), Tensor(b)], axis=axis).numpy(),
                                      np.stack([a, b], axis=axis))
        check_vs_torch(torch, lambda x, y: F.stack([x, y], axis), lambda x, y: torch.stack([x, y], axis), [a, b])


def test_stack_negative_axis_and_a_broadcast_input():
    x1 = Tensor(np.arange(0, 3, dtype=np.float32))
    x2 = Tensor(np.arange(6, 9, dtype=np.float32))
    np.testing.assert_array_equal(F.stack([x1, x2], axis=-1).numpy(), [[0, 6], [1, 7], [2, 8]])
    a = Tensor(np.random.default_rng(0).random(600))
    b = F.broadcast_to(Tensor(np.array(3)), (600,))
    np.testing.assert_array_equal(F.stack([b, a], axis=0).numpy(), np.stack((b.numpy(), a.numpy())))
    np.testing.assert_array_equal(F.stack([b, b], axis=0).numpy(), np.stack((b.numpy(), b.numpy())))


def test_split_basic():
    data = rand(2, 3, 4, 5)
    inp = Tensor(data)
    by_count, by_index = F.split(inp, 2, axis=3), F.split(inp, [3], axis=3)
    want = np.split(data, [3, 5], axis=3)
    assert len(by_count) == len(by_index) == 2
    for got in (by_count, by_index):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)
    with pytest.raises(ValueError):
        F.split(inp, 4)                      # axis 0 has 2 elements
    with pytest.raises(ValueError):
        # MegEngine's message is "Invalid nsplits_or_secions: [3, 2, 5]";
        # gradcore's names the op, the shape and what is wrong instead
        F.split(inp, [3, 2, 5], axis=3)


def test_split_piece_sizes_and_empty_inputs():
    x = Tensor(np.random.default_rng(0).random((10, 20)), dtype=np.float32)
    assert [p.shape for p in F.split(x, 3, axis=-1)] == [(10, 7), (10, 7), (10, 6)]
    assert [p.shape for p in F.split(x, [6, 17], axis=-1)] == [(10, 6), (10, 11), (10, 3)]
    full, empty = rand(3, 4, 5, 6), np.zeros((0, 4, 5, 6), np.float32)
    for data in (full, empty):
        for sections in (2, [3], [3, 3, 5]):
            want = np.split(data, sections, 3)
            got = F.split(Tensor(data), sections, 3)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape
                np.testing.assert_array_equal(g.numpy(), w)


def test_split_gradient(torch):
    x = randn(3, 4, 5, 6)
    check_vs_torch(torch, lambda t: F.concat([p * (i + 1.0) for i, p in enumerate(F.split(t, [3, 3, 5], 3))], 3),
                   lambda t: torch.cat([p * (i + 1.0) for i, p in enumerate(torch.tensor_split(t, [3, 3, 5], 3))], 3),
                   [x])


def test_gather(torch):
    y = F.gather(Tensor([[1, 2], [3, 4], [5, 6]]), 1, Tensor([[0, 1], [1, 0], [1, 1]]))
    np.testing.assert_array_equal(y.numpy(), [[1, 2], [4, 3], [6, 6]])
    index = np.array([[0, 1], [1, 0], [1, 1]])
    check_vs_torch(torch, lambda x, i: F.gather(x, 1, i), lambda x, i: torch.gather(x, 1, i),
                   [randn(3, 2), index])


def test_scatter(torch):
    source = [[0.9935, 0.9465, 0.2256, 0.8926, 0.4396], [0.7723, 0.0718, 0.5939, 0.357, 0.4576]]
    index = np.array([[0, 2, 0, 2, 1], [2, 0, 1, 1, 2]])
    y = F.scatter(Tensor(np.zeros((3, 5), np.float32)), -2, Tensor(index), Tensor(source))
    want = np.zeros((3, 5), np.float32)
    for r in range(2):
        for c in range(5):
            want[index[r, c], c] = source[r][c]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    check_vs_torch(torch, lambda x, i, s: F.scatter(x, -2, i, s), lambda x, i, s: torch.scatter(x, -2, i, s),
                   [randn(3, 5, seed=1), index, np.asarray(source, np.float32)])


def test_swapaxes():
    y = F.swapaxes(Tensor(np.array([[1, 2, 3]], dtype=np.int32)), 0, 1)
    np.testing.assert_array_equal(y.numpy(), [[1], [2], [3]])


def test_reshape_target_shapes_of_every_kind():
    x = np.arange(6, dtype="float32")
    want = x.reshape(1, 2, 3)
    for shape in [(1, 2, 3), (1, -1, 3), (1, Tensor(-1), 3), np.array([1, -1, 3], dtype="int32"),
                  Tensor([1, -1, 3]), np.array([1, -1, 3], dtype="int64"),
                  (Tensor(1), -1, np.array(3, dtype="int64"))]:
        np.testing.assert_array_equal(F.reshape(Tensor(x), shape).numpy(), want)


def test_reshape_shape_inference():
    known = Tensor([1, 2, 3, 4])
    unknown = F.broadcast_to(Tensor([1.0]), shape=Tensor([1, 1, 1, 1]).sum())
    assert unknown.shape == (4,)
    for x in (known, unknown):
        for target in ((Tensor(2), Tensor(2)), Tensor([2, 2]), (2, 2), (2, -1)):
            assert x.reshape(target).shape == (2, 2)


@pytest.mark.parametrize("src, dst", [((100, 0, 1), (100, 0, 10)), ((10, 0), (0,)), ((10, 0, 10), (0, 1, 2, 3))])
def test_reshape_on_empty_tensor(src, dst):
    assert F.reshape(Tensor(np.zeros(src, np.float32)), dst).shape == dst


def test_broadcast_to_infers_none_from_the_input():
    x = rand(1, 2, 3)
    for shape in [(1, 2, 3), (1, None, 3)]:
        np.testing.assert_array_equal(F.broadcast_to(Tensor(x), shape).numpy(), x)
    with pytest.raises(ValueError):
        F.broadcast_to(Tensor(x), (1, -1, 3))
    with pytest.raises(ValueError):
        F.broadcast_to(Tensor(x), (None, 1, 2, 3))      # None where inp has no axis
    assert F.broadcast_to(Tensor(x), (1, None, 2, 3)).shape == (1, 1, 2, 3)
    assert F.broadcast_to(Tensor(x), (Tensor(2), None, 2, 3)).shape == (2, 1, 2, 3)


@pytest.mark.parametrize("src, dst", [((20, 30), (30, 20, 30)), ((10, 1), (20, 10, 20)), ((10, 10), (10, 10))])
def test_broadcast_to(src, dst, torch):
    x = rand(*src)
    np.testing.assert_array_equal(F.broadcast_to(Tensor(x), dst).numpy(), np.broadcast_to(x, dst))
    check_vs_torch(torch, lambda t: F.broadcast_to(t, dst), lambda t: t.broadcast_to(dst), [x])


@pytest.mark.parametrize("shape", [(2, 3, 4), (4, 1, 3), (1, 3)])
def test_broadcast_to_a_shape_that_does_not_fit_raises(shape):
    # MegEngine raises RuntimeError; gradcore's error is both that and a ValueError
    with pytest.raises(RuntimeError):
        F.broadcast_to(F.ones((2, 1, 3)), shape)
    with pytest.raises(ValueError):
        F.broadcast_to(F.ones((2, 1, 3)), shape)


@pytest.mark.parametrize("src, dst", [((100, 0, 1), (100, 0, 10)), ((10, 0), (10, 10, 0)),
                                      ((0, 0, 1, 10), (10, 0, 0, 10, 10))])
def test_broadcast_on_empty_tensor(src, dst):
    assert F.broadcast_to(Tensor(np.zeros(src, np.float32)), dst).shape == dst


@pytest.mark.parametrize("src, targets", [((3,), [(2, 1, 3), (1, 2, 3), (2, 2, 3)]),
                                          ((1, 3, 1), [(2, None, 3), (3, None, 3), (1, None, 1)])])
def test_broadcast_to_tensor_shapes(src, targets):
    x = F.ones(src)
    for target in targets:
        if None in target:
            shape = tuple(None if d is None else Tensor(d) for d in target)
            want = tuple(x.shape[i - len(target)] if d is None else d for i, d in enumerate(target))
        else:
            shape, want = Tensor(target), target
        assert F.broadcast_to(x, shape).shape == want


def test_squeeze():
    y = F.squeeze(Tensor(np.array([1, 2], dtype=np.int32).reshape(1, 1, 2, 1)), -1)
    np.testing.assert_array_equal(y.numpy(), [[[1, 2]]])
    x = np.arange(6, dtype="float32").reshape(1, 2, 3, 1)
    for axis in [None, 3, -4, (3, -4)]:
        np.testing.assert_array_equal(F.squeeze(Tensor(x), axis).numpy(), np.squeeze(x, axis))


def test_expand_dims():
    y = F.expand_dims(Tensor(np.arange(1, 7, dtype=np.int32).reshape(2, 3)), -1)
    np.testing.assert_array_equal(y.numpy(), [[[1], [2], [3]], [[4], [5], [6]]])
    x = np.arange(6, dtype="float32").reshape(2, 3)
    for axis in [2, -3, (3, -4), (1, -4)]:
        got = F.expand_dims(Tensor(x), axis)
        assert got.shape == np.expand_dims(x, axis).shape
        np.testing.assert_array_equal(got.numpy(), np.expand_dims(x, axis))


def test_expand_dims_of_a_scalar():
    x = np.array(1, dtype="float32")
    for axis in [0, -1, (0, 1), (-1, -2), (0, -1)]:
        np.testing.assert_array_equal(F.expand_dims(Tensor(x), axis).numpy(), np.expand_dims(x, axis))
    for axis in [1, -2, (1, 2), (-2, -3)]:
        with pytest.raises(np.exceptions.AxisError if hasattr(np, "exceptions") else np.AxisError):
            np.expand_dims(x, axis)
        with pytest.raises(RuntimeError):          # MegEngine's exception (gradcore's is a ValueError too)
            F.expand_dims(Tensor(x), axis)


def test_float32_with_float16_promotes_to_float32():
    x = rand(2, 3, seed=1)
    y = rand(1, 3, seed=2).astype("float16")
    for got, want in [(Tensor(x) * Tensor(y), x * y), (Tensor(x) + y, x + y), (x - Tensor(y), x - y)]:
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.numpy(), want)


def test_linspace():
    for start, stop, num in [(1, 9, 9), (3, 10, 8), (9, 1, 9), (10, 3, 8)]:
        np.testing.assert_allclose(F.linspace(start, stop, num).numpy(),
                                   np.linspace(start, stop, num, dtype=np.float32))
    for args in [(1, Tensor(9), 9), (Tensor(1), 9, Tensor(9))]:
        np.testing.assert_allclose(F.linspace(*args).numpy(), np.linspace(1, 9, 9, dtype=np.float32))


def test_arange():
    for start, stop, step in [(1, 9, 1), (2, 10, 2), (9, 1, -1), (10, 2, -2), (9.3, 1.2, -0.5), (10.3, 2.1, -1.7)]:
        got = F.arange(start, stop, step)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got.numpy(), np.arange(start, stop, step, dtype=np.float32))


@pytest.mark.parametrize("n", [15, 25])
def test_round(n):
    x = rand(n, seed=n)
    np.testing.assert_array_equal(F.round(Tensor(x)).numpy(), np.round(x))


def test_flatten(torch):
    x = Tensor(np.arange(36, dtype=np.int32).reshape(2, 2, 3, 3))
    np.testing.assert_array_equal(F.flatten(x, -2, -1).numpy(), np.arange(36).reshape(2, 2, 9))
    d0, d1 = rand(2, 3, 4, 5, seed=1), rand(4, 5, 6, 7, seed=2)
    for d in (d0, d1):
        np.testing.assert_array_equal(F.flatten(Tensor(d)).numpy(), d.flatten())
        np.testing.assert_array_equal(F.flatten(Tensor(d), start_axis=1).numpy(), d.reshape(d.shape[0], -1))
        np.testing.assert_array_equal(F.flatten(Tensor(d), start_axis=2).numpy(), d.reshape(*d.shape[:2], -1))
        np.testing.assert_array_equal(F.flatten(Tensor(d), start_axis=1, end_axis=2).numpy(),
                                      d.reshape(d.shape[0], -1, d.shape[3]))
    check_vs_torch(torch, lambda t: F.flatten(t, 1, 2), lambda t: torch.flatten(t, 1, 2), [d0])


def test_copy_is_an_identity():
    x = rand(5, 10)
    np.testing.assert_array_equal(F.copy(Tensor(x)).numpy(), x)
    out, (g,), dy = gc_vjp(F.copy, [x])
    np.testing.assert_array_equal(g, dy)


@pytest.mark.parametrize("shape, repeats, axis", [((2,), 2, 0), ((2, 3, 4, 5), 3, 0), ((2, 3, 4, 5), 4, 3),
                                                  ((2,), 2, None), ((2, 3, 4, 5), 3, None), ((), 1, None),
                                                  ((), 10, None)])
def test_repeat(shape, repeats, axis, torch):
    x = randn(*shape) if shape else np.array(1.23, np.float32)
    np.testing.assert_array_equal(F.repeat(Tensor(x), repeats=repeats, axis=axis).numpy(),
                                  np.repeat(x, repeats, axis))

    def ref(t):
        return torch.repeat_interleave(t.reshape(-1) if axis is None else t, repeats, 0 if axis is None else axis)
    check_vs_torch(torch, lambda t: F.repeat(t, repeats, axis), ref, [x])


@pytest.mark.parametrize("shape, reps", [((2,), (2,)), ((2, 3, 4, 5), (1, 1, 1, 1)), ((2, 3, 4, 5), (1, 2, 3, 4))])
def test_tile(shape, reps, torch):
    x = randn(*shape)
    np.testing.assert_array_equal(F.tile(Tensor(x), reps=reps).numpy(), np.tile(x, reps))
    check_vs_torch(torch, lambda t: F.tile(t, reps), lambda t: torch.tile(t, reps), [x])


@pytest.mark.parametrize("shape, shifts, axis", [((2, 3), 0, None), ((2, 3), 1, 0), ((2, 3), 100, 0),
                                                 ((2, 3), -100, 0), ((2, 3, 4, 5), (-1, 1), (0, 1)),
                                                 ((2, 3, 4, 5), (-2, 1, 2), (1, 2, 3))])
def test_roll(shape, shifts, axis, torch):
    y = F.roll(Tensor([[1, 2], [3, 4], [5, 6]], np.int32), 1, -1)
    np.testing.assert_array_equal(y.numpy(), [[2, 1], [4, 3], [6, 5]])
    x = randn(*shape)
    np.testing.assert_array_equal(F.roll(Tensor(x), shifts, axis).numpy(), np.roll(x, shifts, axis))
    check_vs_torch(torch, lambda t: F.roll(t, shifts, axis), lambda t: torch.roll(t, shifts, axis), [x])


@pytest.mark.parametrize("shift", [5, -10])
def test_roll_empty_tensor(shift):
    x = np.zeros((10, 0), np.float32)
    out = F.roll(Tensor(x), shift, 1)
    assert out.shape == (10, 0)
    np.testing.assert_array_equal(out.numpy(), np.roll(x, shift, 1))


# ==================================================================== test_math.py
_NAN_CASE = np.array([[[1, 2, np.nan, 4], [8, 6, 5, 2], [2, 3, 4, 5]]])
_REDUCE_CASES = [rand(5, 6, 7, seed=11), rand(2, 9, 12, seed=12), _NAN_CASE]


@pytest.mark.parametrize("name", ["sum", "prod", "mean", "var", "std", "min", "max"])
def test_reductions_every_axis_and_keepdims(name):
    fn, ref = getattr(F, name), getattr(np, name)
    for data in _REDUCE_CASES:
        tol = dict(rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(fn(Tensor(data)).numpy(), ref(data), **tol)
        for axis in range(-3, 3):
            np.testing.assert_allclose(fn(Tensor(data), axis=axis).numpy(), ref(data, axis=axis), **tol)
            got = fn(Tensor(data), axis=axis, keepdims=True)
            want = ref(data, axis=axis, keepdims=True)
            assert got.shape == want.shape
            np.testing.assert_allclose(got.numpy(), want, **tol)


_TORCH_REDUCE = {
    "sum": lambda t, a: t.sum(a), "mean": lambda t, a: t.mean(a), "prod": lambda t, a: t.prod(a),
    "var": lambda t, a: t.var(a, unbiased=False), "std": lambda t, a: t.std(a, unbiased=False),
    "max": lambda t, a: t.amax(a), "min": lambda t, a: t.amin(a),
}


@pytest.mark.parametrize("name", sorted(_TORCH_REDUCE))
@pytest.mark.parametrize("axis", [-3, -1, 0, 2])
def test_reduction_gradients(name, axis, torch):
    x = rand(5, 6, 7, seed=11) + 0.5
    check_vs_torch(torch, lambda t: getattr(F, name)(t, axis=axis), lambda t: _TORCH_REDUCE[name](t, axis), [x])


@pytest.mark.parametrize("name", ["argmin", "argmax"])
def test_arg_reductions(name):
    fn, ref = getattr(F, name), getattr(np, name)
    for data in _REDUCE_CASES:
        got = fn(Tensor(data))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got.numpy(), ref(data))
        for axis in range(0, 3):
            for a in (axis, axis - 3):
                got = fn(Tensor(data), axis=a)
                assert got.dtype == np.int32
                np.testing.assert_array_equal(got.numpy(), ref(data, axis=a))


def test_reductions_of_int32():
    x = Tensor(np.arange(1, 7, dtype=np.int32).reshape(2, 3))
    # the values are MegEngine's; the dtypes NumPy's (int sum/prod: int64, mean/var/std: float64)
    np.testing.assert_array_equal(F.sum(x, axis=-1).numpy(), [6, 15])
    np.testing.assert_array_equal(F.prod(x, axis=-2).numpy(), [4, 10, 18])
    np.testing.assert_array_equal(F.mean(x, axis=-2).numpy(), [2.5, 3.5, 4.5])
    np.testing.assert_array_equal(F.var(x, axis=-2).numpy(), [2.25, 2.25, 2.25])
    np.testing.assert_array_equal(F.std(x, axis=-2).numpy(), [1.5, 1.5, 1.5])
    np.testing.assert_array_equal(F.min(x, axis=-1).numpy(), [1, 4])
    np.testing.assert_array_equal(F.max(x, axis=-1).numpy(), [3, 6])
    np.testing.assert_array_equal(F.argmin(x, axis=-1).numpy(), [0, 0])
    np.testing.assert_array_equal(F.argmax(x, axis=-2).numpy(), [1, 1, 1])
    assert F.min(x, axis=-1).dtype == np.int32 and F.argmax(x, axis=-2).dtype == np.int32


def test_norm_of_int32():
    y = F.norm(Tensor(np.arange(1, 7, dtype=np.int32).reshape(2, 3)), axis=-1)
    assert y.dtype == np.float32            # integers in, float32 out (gradcore.dtypes)
    np.testing.assert_allclose(y.numpy(), [14 ** 0.5, 77 ** 0.5], rtol=1e-6)
    np.testing.assert_array_equal(y.numpy().round(decimals=3), np.float32([3.742, 8.775]))


@pytest.mark.parametrize("n", [15, 25])
def test_sqrt(n, torch):
    x = rand(n, seed=n) + 0.01
    np.testing.assert_allclose(F.sqrt(Tensor(x)).numpy(), np.sqrt(x), rtol=1e-6)
    check_vs_torch(torch, F.sqrt, torch.sqrt, [x])


def test_sort_along_any_axis_is_stable():
    rng = np.random.default_rng(3)
    for _ in range(10):
        dim = int(rng.integers(1, 5))
        data = rng.integers(-100, 101, size=rng.integers(1, 20, size=(dim,)))
        axis = int(rng.integers(-dim, dim))
        values, indices = F.sort(Tensor(data), False, axis)
        np.testing.assert_array_equal(values.numpy(), np.sort(data, axis))
        np.testing.assert_array_equal(indices.numpy(), np.argsort(data, axis, kind="stable"))
        assert indices.dtype == np.int32


@pytest.mark.parametrize("shape", [(10, 3), (12, 2)])
def test_sort_rows(shape):
    data = rand(*shape, seed=shape[0])
    values, indices = F.sort(Tensor(data))
    np.testing.assert_array_equal(values.numpy(), np.sort(data))
    np.testing.assert_array_equal(indices.numpy(), np.argsort(data))


@pytest.mark.parametrize("shape", [(0,), (10, 0)])
def test_sort_empty(shape):
    data = np.zeros(shape, np.float32)
    values, indices = F.sort(Tensor(data))
    np.testing.assert_array_equal(values.numpy(), np.sort(data))
    np.testing.assert_array_equal(indices.numpy(), np.argsort(data))


@pytest.mark.parametrize("descending", [True, False])
@pytest.mark.parametrize("shape", [(16, 32), (16, 1), (1, 16), (1, 1), (16,), (1,)])
def test_sort_and_argsort_gradients(shape, descending, torch):
    x, x2 = randn(*shape, seed=1), randn(*shape, seed=2)
    out, _ = check_vs_torch(torch, lambda t: F.sort(t, descending)[0],
                            lambda t: torch.sort(t, -1, descending=descending)[0], [x])
    order = np.argsort(-x2 if descending else x2, -1, kind="stable")
    np.testing.assert_array_equal(F.argsort(Tensor(x2), descending).numpy(), order)


def test_normalize():
    y = F.normalize(Tensor(np.arange(1, 7, dtype=np.int32).reshape(2, 3)), axis=-1)
    assert y.dtype == np.float32            # integers in, float32 out (gradcore.dtypes)
    np.testing.assert_array_equal(y.numpy().round(decimals=1),
                                  np.float32([[0.3, 0.5, 0.8], [0.5, 0.6, 0.7]]))

    def ref(x, axis, eps=1e-12):
        n = np.sum(x ** 2, axis=axis, keepdims=True) ** 0.5
        return x / np.clip(n, eps, np.inf)

    cases = [rand(2, 3, 12, 12, seed=s) for s in range(2)]
    for x in cases:
        np.testing.assert_allclose(F.normalize(Tensor(x), axis=1).numpy(), ref(x, 1), rtol=1e-5, atol=1e-7)
        x[0, 0, 0, :] = 0                                   # a vector of norm 0 stays 0
        np.testing.assert_allclose(F.normalize(Tensor(x), axis=3).numpy(), ref(x, 3), rtol=1e-5, atol=1e-7)


def test_normalize_gradient(torch):
    x = rand(2, 3, 12, 12, seed=4)
    check_vs_torch(torch, lambda t: F.normalize(t, axis=1),
                   lambda t: torch.nn.functional.normalize(t, 2.0, 1, 1e-12), [x])


def test_sum_negative_axes():
    data = rand(2, 3)
    for axis in (-1, -2, (-2, 1), (-1, 0)):
        np.testing.assert_allclose(F.sum(Tensor(data), axis=axis).numpy(), np.sum(data, axis=axis), rtol=1e-6)
    with pytest.raises(AssertionError):                 # MegEngine's; gradcore's is also a ValueError
        F.sum(Tensor(data), axis=(-1, 1))


@pytest.mark.parametrize("descending", [True, False])
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("inp1d", [True, False])
@pytest.mark.parametrize("kth_only", [True, False])
def test_topk(descending, sort, inp1d, kth_only):
    k = 3
    rng = np.random.default_rng(5)
    data = (rng.permutation(7) if inp1d else rng.permutation(35).reshape(5, 7)).astype(np.int32)
    ordered = np.sort(data)[..., ::-1] if descending else np.sort(data)
    values, indices = F.topk(Tensor(data), k, descending=descending, no_sort=not sort, kth_only=kth_only)
    values, indices = values.numpy(), indices.numpy()
    if kth_only:
        np.testing.assert_array_equal(values, np.take_along_axis(data, indices[..., None], -1)[..., 0])
        np.testing.assert_array_equal(values, ordered[..., k - 1])
    else:
        np.testing.assert_array_equal(values, np.take_along_axis(data, indices, -1))
        if not sort:
            values = np.sort(values)[..., ::-1] if descending else np.sort(values)
        np.testing.assert_array_equal(values, ordered[..., :k])


@pytest.mark.parametrize("descending", [True, False])
@pytest.mark.parametrize("shape, k", [((2, 16), 1), ((2, 16), 8), ((1, 16), 1), ((1, 16), 5), ((16,), 8), ((1,), 1)])
def test_topk_gradient(shape, k, descending, torch):
    x = randn(*shape, seed=k)
    check_vs_torch(torch, lambda t: F.topk(t, k, descending, False, False)[0],
                   lambda t: torch.topk(t, k, -1, largest=descending, sorted=True)[0], [x])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
@pytest.mark.parametrize("shape, axis", [((0,), None), ((3, 0, 2), 1), ((10, 10, 0, 10), 0)])
def test_sum_and_prod_of_empty_tensors(dtype, shape, axis):
    data = np.random.default_rng(0).random(shape).astype(dtype)
    for fn, ref in ((F.sum, np.sum), (F.prod, np.prod)):
        got = fn(Tensor(data, dtype=dtype), axis=axis)
        want = ref(data, axis=axis)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)


# ==================================================================== test_elemwise.py
def test_abs():
    np.testing.assert_array_equal(F.abs(Tensor([-3.0, -4.0, -5.0])).numpy(), [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(F.abs(-3.0).numpy(), np.float32(3.0))


def test_multiply():
    np.testing.assert_array_equal(F.mul(-3.0, -4.0).numpy(), np.float32(12.0))
    np.testing.assert_array_equal(F.mul(Tensor([3.0, 4.0]), 4.0).numpy(), [12.0, 16.0])
    np.testing.assert_array_equal(F.mul(4.0, Tensor([3.0, 4.0])).numpy(), [12.0, 16.0])
    np.testing.assert_array_equal(F.mul(Tensor([3.0, 4.0]), Tensor([3.0, 4.0])).numpy(), [9.0, 16.0])


def test_multiply_uint16_stays_uint16():
    x = (np.random.default_rng(0).random((1, 4, 512, 512)) * 255).astype("uint16")
    y = F.mul(Tensor(x), Tensor(2, dtype="uint16"))
    assert y.dtype == np.uint16
    np.testing.assert_array_equal(y.numpy(), x * np.array([2], dtype="uint16"))


def test_div_and_floor_div():
    np.testing.assert_allclose(F.div(Tensor([3.0, 4.0]), 2).numpy(), [1.5, 2.0])
    np.testing.assert_allclose((Tensor([3, 4]) / 2).numpy(), [1.5, 2.0])   # float64 here: NumPy's int / int
    np.testing.assert_array_equal(F.floor_div(Tensor([-5.0, -7.0]), 2).numpy(), [-3.0, -4.0])
    np.testing.assert_array_equal((Tensor([-5, -7]) // 2).numpy(), [-3, -4])
    np.testing.assert_array_equal((Tensor([[5, 4, 3], [4, 2, 6]]) // [1, 2, 1]).numpy(), [[5, 2, 3], [4, 1, 6]])


def test_clip_with_a_zero_bound(torch):
    x = np.linspace(-6, 6, dtype="float32")
    np.testing.assert_allclose(F.clip(Tensor(x) + 3, 0, 6).numpy(), np.clip(x + 3, 0, 6))
    np.testing.assert_allclose(F.clip(Tensor(x) - 3, -6, 0).numpy(), np.clip(x - 3, -6, 0))
    check_vs_torch(torch, lambda t: F.clip(t + 3, 0, 6), lambda t: torch.clamp(t + 3, 0, 6), [x])
    check_vs_torch(torch, lambda t: F.clip(t - 3, -6, 0), lambda t: torch.clamp(t - 3, -6, 0), [x])


def test_erf(torch):
    x = np.array([-1.5, 0.0, 1.0, 1.5], "float32")
    np.testing.assert_allclose(F.erf(Tensor(x)).numpy(), [math.erf(v) for v in x], rtol=1e-5)
    check_vs_torch(torch, F.erf, torch.erf, [x])


def test_isnan_isinf_sign():
    np.testing.assert_array_equal(F.isnan(Tensor([1, float("nan"), 0])).numpy(), [False, True, False])
    np.testing.assert_array_equal(F.isinf(Tensor([1, float("inf"), 0])).numpy(), [False, True, False])
    x = Tensor([1, -1, 0])
    y = F.sign(x)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y.numpy(), [1, -1, 0])


@pytest.mark.parametrize("name, np_fn, torch_name, make, decimal", [
    ("cosh", np.cosh, "cosh", lambda r: r.standard_normal(100), 5),
    ("sinh", np.sinh, "sinh", lambda r: r.standard_normal(100), 5),
    ("asinh", np.arcsinh, "asinh", lambda r: r.standard_normal(100), 5),
    ("acosh", np.arccosh, "acosh", lambda r: np.arange(0, 10000) / 100 + 1, 5),
    ("atanh", np.arctanh, "atanh", lambda r: r.random(100) * 2 - 1, 5),
])
def test_hyperbolic(name, np_fn, torch_name, make, decimal, torch):
    x = make(np.random.default_rng(42)).astype("float32")
    got = getattr(F, name)(Tensor(x)).numpy()
    np.testing.assert_allclose(got, np_fn(x), rtol=10.0 ** -decimal, atol=10.0 ** -decimal)
    if name == "acosh":
        x = x[1:]                   # the gradient is infinite at 1
    check_vs_torch(torch, getattr(F, name), getattr(torch, torch_name), [x], rtol=2e-4)


def test_hswish_hsigmoid_silu(torch):
    x = np.random.default_rng(42).standard_normal(100).astype("float32")
    relu6 = np.minimum(np.maximum(x + 3, 0), 6)
    np.testing.assert_allclose(F.hswish(Tensor(x)).numpy(), x * relu6 / 6, atol=1e-6)
    np.testing.assert_allclose(F.hsigmoid(Tensor(x)).numpy(), relu6 / 6, atol=1e-6)
    s = np.array([-1.5, 0.0, 1.0, 1.5], "float32")
    np.testing.assert_allclose(F.silu(Tensor(s)).numpy(), s / (1 + np.exp(-s)), atol=1e-6)
    tf = torch.nn.functional
    check_vs_torch(torch, F.hswish, tf.hardswish, [x])
    check_vs_torch(torch, F.hsigmoid, tf.hardsigmoid, [x])
    check_vs_torch(torch, F.silu, tf.silu, [x])


def test_logical_ops():
    x = np.array([[True, False], [False, True]])
    y = np.array([[True, True], [False, False]])
    np.testing.assert_array_equal(F.logical_not(Tensor(x)).numpy(), ~x)
    np.testing.assert_array_equal(F.logical_and(Tensor(x), Tensor(y)).numpy(), x & y)
    np.testing.assert_array_equal(F.logical_or(Tensor(x), Tensor(y)).numpy(), x | y)
    np.testing.assert_array_equal(F.logical_xor(Tensor(x), Tensor(y)).numpy(), x ^ y)
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2, (1, 32)).astype(bool), rng.integers(0, 2, (1, 31)).astype(bool)
    sliced = Tensor(a)[:, 1:]
    np.testing.assert_array_equal(F.logical_xor(sliced, Tensor(b)).numpy(), a[:, 1:] ^ b)
    np.testing.assert_array_equal(F.logical_xor(Tensor(b), sliced).numpy(), b ^ a[:, 1:])


def test_logaddexp(torch):
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((2, 100)), rng.standard_normal((2, 100))
    np.testing.assert_allclose(F.logaddexp(Tensor(x), Tensor(y)).numpy(), np.log(np.exp(x) + np.exp(y)),
                               atol=1e-6)
    check_vs_torch(torch, F.logaddexp, torch.logaddexp, [x, y], rtol=1e-10, atol=1e-12)


_UNARY = ["abs", "acos", "asin", "atan", "asinh", "acosh", "atanh", "ceil", "cos", "cosh", "exp", "expm1",
          "floor", "log", "log1p", "neg", "round", "sin", "sinh", "sqrt", "square", "tan", "tanh", "sign",
          "relu", "sigmoid", "hswish", "hsigmoid", "silu", "gelu", "relu6", "softplus", "logsigmoid",
          "isnan", "isinf"]
_BINARY = ["add", "atan2", "div", "equal", "floor_div", "greater", "greater_equal", "less", "less_equal",
           "logaddexp", "maximum", "minimum", "mod", "mul", "not_equal", "pow", "sub"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")      # acos(5) and friends are NaN, as in NumPy
def test_int32_inputs_work_for_every_elementwise_function():
    x = Tensor(np.array([1, 2, 3, 4, 5]), dtype="int32")
    for name in _UNARY:
        getattr(F, name)(x).numpy()
    for name in _BINARY:
        getattr(F, name)(x, x).numpy()
    F.clip(x, 0, 1).numpy()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_elementwise_functions_on_empty_tensors():
    empties = [np.array([], "float32"), np.zeros((2, 0, 3), "float32")]
    for a in empties:
        for name in _UNARY:
            assert getattr(F, name)(Tensor(a)).numpy().shape == a.shape, name
        assert F.clip(Tensor(a), lower=0, upper=1).numpy().shape == a.shape
        for name in _BINARY:
            assert getattr(F, name)(Tensor(a), Tensor(a)).numpy().shape == a.shape, name
            assert getattr(F, name)(Tensor(a), Tensor(123, dtype="float32")).numpy().shape == a.shape, name
        b = a.astype(bool)
        assert F.logical_not(Tensor(b)).numpy().shape == a.shape
        for name in ("logical_and", "logical_or", "logical_xor"):
            assert getattr(F, name)(Tensor(b), Tensor(b)).numpy().shape == a.shape
            assert getattr(F, name)(Tensor(b), Tensor(True)).numpy().shape == a.shape


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_of_a_tensor_with_itself_has_gradient_one(name):
    for _ in range(3):
        x = F.arange(10)
        gm = GradManager().attach(x)
        with gm:
            gm.backward(getattr(F, name)(x, x))
        np.testing.assert_array_equal(x.grad.numpy(), np.ones(10))


@pytest.mark.parametrize("name, tname", [("logsigmoid", "logsigmoid"), ("softplus", "softplus")])
def test_logsigmoid_and_softplus_trained_through_square_loss(name, tname, torch):
    x = np.random.default_rng(6).random((2, 16, 10, 16)).astype(np.float32)
    target = np.float32(2.0)

    def g(t):
        return F.square_loss(F.sum(getattr(F, name)(t)), Tensor(target))

    def r(t):
        return (getattr(torch.nn.functional, tname)(t).sum() - float(target)) ** 2
    gm_out, (grad,), _ = gc_vjp(g, [x], dy=np.float32(1))
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    r(t).backward()
    np.testing.assert_allclose(gm_out, r(torch.tensor(x.astype(np.float64))).item(), rtol=1e-5)
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=1e-4, atol=1e-6)


# ==================================================================== test_functional.py
def test_where(torch):
    cases = [
        (np.array([[1, 0], [0, 1]], bool), np.array([[1, np.inf], [np.nan, 4]], np.float32),
         np.array([[5, 6], [7, 8]], np.float32)),
        (np.array([[1, 0, 1], [1, 0, 0], [1, 1, 0]], bool),
         np.array([[1, np.inf, 2], [0, np.nan, 4], [1, 5, 7]], np.float32),
         np.array([[5, 6, 9], [2, 7, 8], [2, 1, 9]], np.float32)),
        (np.array([1, 1, 1], bool), np.array([1, 3, 2], np.float32), np.array([5, 6, 9], np.float32)),
        (np.array([0, 0, 0], bool), np.array([1, 3, 2], np.float32), np.array([5, 6, 9], np.float32)),
    ]
    for mask, x, y in cases:
        np.testing.assert_array_equal(F.where(Tensor(mask), Tensor(x), Tensor(y)).numpy(), np.where(mask, x, y))
        _, (_, gx, gy), dy = gc_vjp(F.where, [mask, x, y])
        np.testing.assert_array_equal(gx, np.where(mask, dy, 0))
        np.testing.assert_array_equal(gy, np.where(mask, 0, dy))


def test_dropout_training_and_eval():
    data = Tensor(np.ones(1_000_000, dtype=np.float32))
    out = F.nn.dropout(data, 1.0 / 3.0, training=True).numpy()
    assert not out.all()
    np.testing.assert_allclose(out[out != 0], 1.5, rtol=1e-6)      # kept ones are scaled by 1 / (1 - p)
    assert F.nn.dropout(data, 1.0 / 3.0, training=False).numpy().all()
    assert F.nn.dropout(Tensor(np.ones(10, np.float32)), 1.0 / 3.0, training=False).numpy().sum() >= 0.0


_MATMUL_PAIRS = [((3,), (3,)), ((3,), (3, 5)), ((3, 5), (5, 6)), ((2,), (10, 2, 3)), ((10, 2, 3), (10, 3, 4)),
                 ((10, 3, 4), (10, 10, 4, 2)), ((10, 10, 4, 2), (10, 10, 2, 4))]


@pytest.mark.parametrize("sa, sb", _MATMUL_PAIRS)
def test_matmul(sa, sb, torch):
    a, b = rand(*sa, seed=1), rand(*sb, seed=2)
    np.testing.assert_allclose(F.matmul(Tensor(a), Tensor(b)).numpy(), np.matmul(a, b), rtol=1e-5)
    check_vs_torch(torch, F.matmul, torch.matmul, [a, b])


def test_matmul_transposed(torch):
    v, m3, m4 = rand(2, seed=1), rand(10, 3, 4, seed=2), rand(10, 10, 4, 2, seed=3)
    m2 = rand(10, 2, 3, seed=4)
    np.testing.assert_allclose(F.matmul(Tensor(v), Tensor(m4), transpose_b=True).numpy(),
                               np.matmul(v, m4.transpose(0, 1, 3, 2)), rtol=1e-5)
    np.testing.assert_allclose(F.matmul(Tensor(m3), Tensor(m2), transpose_a=True, transpose_b=True).numpy(),
                               np.matmul(m3.transpose(0, 2, 1), m2.transpose(0, 2, 1)), rtol=1e-5)
    check_vs_torch(torch, lambda x, y: F.matmul(x, y, transpose_b=True),
                   lambda x, y: torch.matmul(x, y.transpose(-1, -2)), [v, m4])
    check_vs_torch(torch, lambda x, y: F.matmul(x, y, True, True),
                   lambda x, y: torch.matmul(x.transpose(-1, -2), y.transpose(-1, -2)), [m3, m2])


# (lhs shape, rhs shape, transpose_a, transpose_b): MegEngine's broadcasting matmul cases
_MATMUL_T = [
    ((5,), (5,), False, False), ((4, 5), (5,), False, False), ((5,), (5, 6), False, False),
    ((5, 4), (5,), True, False), ((4, 5), (5, 6), False, False), ((4, 5), (6, 5), False, True),
    ((5, 4), (5, 6), True, False), ((5, 4), (6, 5), True, True), ((2, 3, 4, 5), (5, 6), False, False),
    ((2, 3, 4, 5), (6, 5), False, True), ((2, 1, 5, 4), (5, 6), True, False), ((2, 1, 5, 4), (6, 5), True, True),
    ((1, 5, 4), (5, 6), True, False), ((1, 5, 4), (6, 5), True, True), ((4, 5), (2, 3, 5, 6), False, False),
    ((4, 5), (2, 3, 6, 5), False, True), ((5, 4), (2, 1, 5, 6), True, False), ((5, 4), (2, 1, 6, 5), True, True),
    ((5, 4), (1, 5, 6), True, False), ((5, 4), (1, 6, 5), True, True), ((1, 4, 5), (1, 5, 6), False, False),
    ((1, 5, 4), (1, 5, 6), True, False), ((3, 4, 5), (3, 5, 6), False, False), ((3, 5, 4), (3, 6, 5), True, True),
    ((5, 3, 2, 7, 8), (3, 2, 8, 9), False, False), ((5, 1, 2, 7, 8), (1, 2, 9, 8), False, True),
    ((5, 3, 2, 8, 7), (3, 1, 8, 9), True, False), ((5, 3, 2, 8, 7), (1, 2, 9, 8), True, True),
    ((5, 3, 2, 8, 7), (1, 8, 9), True, False), ((5, 3, 1, 8, 7), (1, 9, 8), True, True),
    ((3, 2, 7, 8), (4, 3, 2, 8, 9), False, False), ((3, 1, 7, 8), (4, 3, 1, 9, 8), False, True),
    ((3, 1, 8, 7), (4, 3, 2, 8, 9), True, False), ((1, 2, 8, 7), (4, 2, 2, 9, 8), True, True),
    ((1, 8, 7), (4, 3, 2, 8, 9), True, False), ((1, 8, 7), (4, 3, 1, 9, 8), True, True),
]


@pytest.mark.parametrize("sa, sb, ta, tb", _MATMUL_T)
def test_matmul_broadcast_and_transpose(sa, sb, ta, tb, torch):
    a, b = randn(*sa, seed=1, scale=0.1), randn(*sb, seed=2, scale=0.1)

    def ref(x, y):
        x = x.transpose(-1, -2) if ta and x.ndim > 1 else x
        y = y.transpose(-1, -2) if tb and y.ndim > 1 else y
        return torch.matmul(x, y)
    check_vs_torch(torch, lambda x, y: F.matmul(x, y, ta, tb), ref, [a, b], atol=1e-6)


@pytest.mark.parametrize("sa, sb", [((0,), (0,)), ((10, 0), (0, 10)), ((3, 10, 0), (3, 0, 10))])
def test_matmul_of_empty_tensors_is_zero(sa, sb):
    out = F.matmul(Tensor(np.zeros(sa)), Tensor(np.zeros(sb))).numpy()
    assert out.shape == np.matmul(np.zeros(sa), np.zeros(sb)).shape
    assert np.all(out == 0)


def test_adaptive_avg_pool2d_values_and_gradient():
    x = np.arange(0, 16, dtype=np.float32).reshape(1, 1, 4, 4)
    out, (g,), _ = gc_vjp(lambda t: F.adaptive_avg_pool2d(t, (2, 2)), [x], dy=np.ones((1, 1, 2, 2)))
    np.testing.assert_array_equal(out, [[[[2.5, 4.5], [10.5, 12.5]]]])
    np.testing.assert_array_equal(g, np.full((1, 1, 4, 4), 0.25, np.float32))


def test_adaptive_max_pool2d_values_and_gradient():
    x = np.arange(0, 16, dtype=np.float32).reshape(1, 1, 4, 4)
    out, (g,), _ = gc_vjp(lambda t: F.adaptive_max_pool2d(t, (2, 2)), [x], dy=np.ones((1, 1, 2, 2)))
    np.testing.assert_array_equal(out, [[[[5, 7], [13, 15]]]])
    want = np.zeros((4, 4), np.float32)
    want[1::2, 1::2] = 1
    np.testing.assert_array_equal(g[0, 0], want)


def _adaptive_ref(torch, kind, oshape, in_hw):
    """MegEngine's adaptive window: stride in // out, window in - (out - 1) * stride."""
    stride = tuple(i // o for i, o in zip(in_hw, oshape))
    window = tuple(i - (o - 1) * s for i, o, s in zip(in_hw, oshape, stride))
    pool = torch.nn.functional.avg_pool2d if kind == "avg" else torch.nn.functional.max_pool2d
    return lambda t: pool(t, window, stride)


@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize("oshape", [(1, 1), (2, 2), 3, (4, 4), (2, 4), (5, 5), (5, 7)])
@pytest.mark.parametrize("ishape", [(4, 3, 24, 24), (4, 3, 17, 13)])
def test_adaptive_pooling(kind, oshape, ishape, torch):
    # MegEngine uses (32, 16, ...) inputs; fewer samples and channels here, same spatial sizes
    o = (oshape, oshape) if isinstance(oshape, int) else oshape
    fn = F.adaptive_avg_pool2d if kind == "avg" else F.adaptive_max_pool2d
    x = randn(*ishape, seed=sum(o))
    check_vs_torch(torch, lambda t: fn(t, oshape), _adaptive_ref(torch, kind, o, ishape[2:]), [x])
    if ishape[2] % o[0] == 0 and ishape[3] % o[1] == 0:      # exact bins: PyTorch's adaptive pooling agrees
        tpool = getattr(torch.nn.functional, f"adaptive_{kind}_pool2d")
        check_vs_torch(torch, lambda t: fn(t, oshape), lambda t: tpool(t, o), [x])


@pytest.mark.parametrize("name, ishape, kernel, stride, padding, kw", [
    ("max_pool2d", (8, 16, 8, 13), (3, 3), 2, 1, {}),
    ("avg_pool2d", (8, 16, 8, 13), (3, 1), (2, 1), (1, 0), {"mode": "average"}),
    ("avg_pool2d", (8, 16, 8, 2), (3, 3), 2, 1, {}),
])
def test_pooling(name, ishape, kernel, stride, padding, kw, torch):
    x = randn(*ishape, seed=3)
    tf = torch.nn.functional
    if name == "max_pool2d":
        ref = lambda t: tf.max_pool2d(t, kernel, stride, padding)  # noqa: E731
    else:
        # "average" counts the padding; the default mode does not
        include = kw.get("mode") == "average"
        ref = lambda t: tf.avg_pool2d(t, kernel, stride, padding, count_include_pad=include)  # noqa: E731
    check_vs_torch(torch, lambda t: getattr(F, name)(t, kernel, stride, padding, **kw), ref, [x])


@pytest.mark.parametrize("ishape, axis", [((8, 16, 8, 8), 1), ((1, 16, 17, 128), [0, 2]), ((32, 16, 5), -2),
                                          ((32, 16, 5), 0), ((1, 16, 5), -1), ((14, 1, 13, 5), 1)])
def test_softmax(ishape, axis, torch):
    x = randn(*ishape, seed=len(ishape))

    def ref(t):
        dims = tuple(axis) if isinstance(axis, list) else (axis,)
        return torch.exp(t - torch.logsumexp(t, dims, keepdim=True))
    check_vs_torch(torch, lambda t: F.softmax(t, axis=axis), ref, [x], atol=1e-6)


@pytest.mark.parametrize("xs, ws, bs, stride, padding, groups", [
    ((4, 16, 24, 24), (32, 16, 3, 3), (1, 32, 1, 1), 1, 1, 1),
    ((4, 16, 24, 24), (32, 16, 3, 3), (1, 32, 1, 1), (2, 3), (2, 1), 1),
    ((4, 16, 24, 24), (16, 1, 1, 3, 3), None, (2, 3), (2, 1), 16),
    ((4, 16, 24, 24), (32, 16, 1, 1), None, 1, 1, 1),
    ((4, 16, 1, 1), (32, 16, 1, 1), (1, 32, 1, 1), (2, 3), (2, 1), 1),
    ((4, 16, 24, 24), (16, 1, 1, 1, 1), (1, 16, 1, 1), (2, 3), (2, 1), 16),
    ((4, 16, 24, 24), (4, 4, 4, 1, 1), (1, 16, 1, 1), (2, 3), (2, 1), 4),
])
def test_conv2d(xs, ws, bs, stride, padding, groups, torch):
    x, w = rand(*xs, seed=1, scale=0.1), rand(*ws, seed=2, scale=0.1)
    arrays = [x, w] + ([rand(*bs, seed=3, scale=0.1)] if bs else [])

    def ref(t, k, b=None):
        k = k.reshape(-1, *k.shape[2:]) if k.ndim == 5 else k         # grouped (G, O/G, C/G, KH, KW)
        y = torch.nn.functional.conv2d(t, k, None, stride, padding, 1, groups)
        return y if b is None else y + b

    check_vs_torch(torch, lambda t, k, b=None: F.conv2d(t, k, b, stride=stride, padding=padding, groups=groups),
                   ref, arrays, atol=3e-5)


def test_conv2d_on_a_numpy_view_input(torch):
    inp = np.random.default_rng(0).standard_normal((3, 224, 224)).astype(np.float32)[np.newaxis, :]
    w = np.random.default_rng(1).standard_normal((16, 3, 3, 3)).astype(np.float32)
    out = F.conv2d(Tensor(inp, dtype=np.float32), Tensor(w), None, (2, 2), (3, 3), (1, 1), 1)
    want = torch.nn.functional.conv2d(torch.tensor(inp), torch.tensor(w), None, (2, 2), (3, 3), (1, 1), 1)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_conv1d(torch):
    out = F.conv1d(Tensor(np.ones((2, 2, 4), np.float32)), Tensor(np.ones((3, 2, 2), np.float32)), None, 2, 0, 1, 1)
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3, 2), 4, np.float32))
    check_vs_torch(torch, lambda x, w: F.conv1d(x, w, None, 2, 0, 1, 1),
                   lambda x, w: torch.nn.functional.conv1d(x, w, None, 2, 0, 1, 1),
                   [randn(2, 2, 4, seed=1), randn(3, 2, 2, seed=2)])


def test_one_hot():
    np.testing.assert_array_equal(F.one_hot(Tensor(np.arange(1, 4, dtype=np.int32)), num_classes=4).numpy(),
                                  np.eye(4, dtype=np.int32)[np.arange(1, 4)])
    arr = np.array([[3, 2, 4, 4, 2, 4, 0, 4, 4, 1], [4, 1, 1, 3, 2, 2, 4, 2, 4, 3]], dtype=np.int32)
    np.testing.assert_array_equal(F.one_hot(Tensor(arr), 10).numpy(), np.eye(10, dtype=np.int32)[arr])


@pytest.mark.parametrize("ishape, axis, keepdims", [((4, 8, 16), 0, True), ((4, 8, 16), 0, False),
                                                    ((4, 8, 16), 1, True), ((4, 8, 16), 1, False),
                                                    ((4, 8, 16), -1, True), ((4, 8, 16), -1, False),
                                                    ((4, 1, 16), -2, True), ((4, 1, 16), -2, False)])
def test_indexing_one_hot(ishape, axis, keepdims, torch):
    x = randn(*ishape, seed=2)
    idx_shape = list(ishape)
    del idx_shape[axis]
    index = np.random.default_rng(3).integers(0, ishape[axis], idx_shape).astype(np.int32)

    def ref(t, i):
        y = torch.gather(t, axis, i.unsqueeze(axis))
        return y if keepdims else y.squeeze(axis)
    check_vs_torch(torch, lambda t, i: F.nn.indexing_one_hot(t, i, axis, keepdims=keepdims), ref, [x, index])


def test_binary_cross_entropy():
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    rng = np.random.RandomState(123)
    d1, l1 = rng.uniform(size=(2, 2)).astype(np.float32), rng.uniform(size=(2, 2)).astype(np.float32)
    rng = np.random.RandomState(123)
    d2, l2 = rng.uniform(size=(2, 3)).astype(np.float32), rng.uniform(size=(2, 3)).astype(np.float32)
    for data, label, want in [(d1, l1, 0.6361), (d2, l2, 0.6750)]:
        np.testing.assert_allclose(F.nn.binary_cross_entropy(Tensor(data), Tensor(label)).numpy(), want, atol=5e-4)
        np.testing.assert_allclose(
            F.nn.binary_cross_entropy(Tensor(sigmoid(data)), Tensor(label), with_logits=False).numpy(),
            want, atol=5e-4)


def test_hinge_loss():
    rng = np.random.RandomState(123)
    for norm in ("L1", "L2"):
        for shape in [(2, 2), (2, 3)]:
            data = rng.uniform(size=shape).astype(np.float32)
            label = (2 * rng.randint(0, 1, size=shape) - 1).astype(np.float32)
            margin = np.maximum(0, 1 - data * label)
            want = (margin if norm == "L1" else margin ** 2).sum(axis=1).mean()
            np.testing.assert_allclose(F.nn.hinge_loss(Tensor(data), Tensor(label), norm).numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("loss, pshape, lshape, kind, kw", [
    ("l1_loss", (32, 16, 8, 8), (32, 16, 8, 8), "default", {}),
    ("l1_loss", (1, 16), (1, 16), "default", {}),
    ("square_loss", (32, 16, 8, 8), (32, 16, 8, 8), "default", {}),
    ("square_loss", (16, 1), (16, 1), "default", {}),
    ("cross_entropy", (16, 32), (16,), "classes", dict(axis=1, with_logits=True, label_smooth=0.0)),
    ("cross_entropy", (16, 32), (32,), "classes", dict(axis=0, with_logits=False, label_smooth=0.5)),
    ("binary_cross_entropy", (16, 32, 4, 8), (16, 32, 4, 8), "default", dict(with_logits=True)),
    ("binary_cross_entropy", (1, 32, 1), (1, 32, 1), "default", dict(with_logits=False)),
    ("hinge_loss", (32, 16, 8, 8), (32, 16, 8, 8), "default", dict(norm="L1")),
    ("hinge_loss", (1, 16, 1, 1), (1, 16, 1, 1), "default", dict(norm="L2")),
])
def test_losses_and_their_gradients(loss, pshape, lshape, kind, kw, torch):
    rng = np.random.default_rng(9)
    pred = rng.standard_normal(pshape).astype(np.float32)
    if kind == "classes":
        label = rng.integers(0, 10, lshape).astype(np.int32)
    else:
        label = rng.standard_normal(lshape).astype(np.float32)
    if loss == "cross_entropy" and not kw["with_logits"]:
        pred = np.exp(pred) / np.exp(pred).sum(kw["axis"], keepdims=True)      # probabilities
    if loss == "binary_cross_entropy":
        label = 1 / (1 + np.exp(-label))                                        # probabilities
        if not kw["with_logits"]:
            pred = 1 / (1 + np.exp(-pred))
    tf = torch.nn.functional

    def ref(p, lab):
        if loss == "l1_loss":
            return (p - lab).abs().mean()
        if loss == "square_loss":
            return ((p - lab) ** 2).mean()
        if loss == "binary_cross_entropy":
            return (tf.binary_cross_entropy_with_logits if kw["with_logits"] else tf.binary_cross_entropy)(p, lab)
        if loss == "hinge_loss":
            m = torch.clamp(1 - p * lab, min=0)
            return (m if kw["norm"] == "L1" else m ** 2).sum(1).mean()
        logp = tf.log_softmax(p, kw["axis"]) if kw["with_logits"] else torch.log(p)
        if kw["axis"] == 0:
            logp = logp.T
        return tf.nll_loss(logp, lab) * (1 - kw["label_smooth"]) - logp.mean(1).mean() * kw["label_smooth"]

    gfn = getattr(F.nn, loss)
    out, (g, _), dy = gc_vjp(lambda p, lab: gfn(p, lab, **kw), [pred, label], dy=np.float32(0.7))
    t_out, (tg, _) = torch_vjp(torch, ref, [pred, label] if kind == "classes" else [pred, label], dy)
    np.testing.assert_allclose(out, t_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, tg, rtol=1e-4, atol=1e-7)


def test_layer_norm_as_numpy_computes_it():
    def ref(x, normalized_shape, eps=1e-5):
        flat = x.reshape(*x.shape[:x.ndim - len(normalized_shape)], -1).astype(np.float64)
        mean = flat.mean(-1, keepdims=True)
        var = (flat ** 2).mean(-1, keepdims=True) - mean ** 2
        return ((flat - mean) / np.sqrt(var + eps)).reshape(x.shape)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64, 28, 28)).astype(np.float32) + 1
    w = rng.standard_normal((28, 28)).astype(np.float32) + 1
    b = rng.standard_normal((28, 28)).astype(np.float32)
    out = F.nn.layer_norm(Tensor(x), (28, 28), False, Tensor(w), Tensor(b))
    assert np.abs(out.numpy() - ref(x, (28, 28))).mean() < 1e-6

    ones = np.ones((32, 64, 28, 28), np.float32)
    out = F.nn.layer_norm(Tensor(ones), (28, 28), True, Tensor(np.ones((28, 28), np.float32)),
                          Tensor(np.zeros((28, 28), np.float32)))
    assert np.abs(out.numpy()).max() < 1e-7                 # constant rows normalise to 0


@pytest.mark.parametrize("xs, ns, affine", [((4, 16, 24, 24), (24, 24), True), ((4, 16, 24, 24), (24, 24), False),
                                            ((4, 16, 24, 28), (28,), True), ((4, 16, 24, 28), (28,), False)])
def test_layer_norm_gradients(xs, ns, affine, torch):
    arrays = [rand(*xs, seed=1, scale=0.1)] + ([rand(*ns, seed=2, scale=0.1), rand(*ns, seed=3, scale=0.1)]
                                                if affine else [])
    check_vs_torch(torch,
                   lambda x, w=None, b=None: F.nn.layer_norm(x, ns, affine=affine, weight=w, bias=b, eps=1e-5),
                   lambda x, w=None, b=None: torch.nn.functional.layer_norm(x, ns, w, b, 1e-5),
                   arrays, rtol=1e-3, atol=2e-5)


@pytest.mark.parametrize("xs, groups", [((4, 16, 24, 24), 16), ((4, 16, 24, 24), 4), ((4, 16, 24, 24), 1),
                                        ((4, 1, 24, 24), 1), ((16, 1, 1, 1), 1), ((1, 1, 1, 1), 1),
                                        ((1, 16, 1, 1), 16), ((1, 16, 1, 1), 4), ((1, 1, 24, 24), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(xs, groups, affine, torch):
    c = xs[1]
    arrays = [rand(*xs, seed=1, scale=0.1)] + ([rand(c, seed=2, scale=0.1), rand(c, seed=3, scale=0.1)]
                                                if affine else [])

    def by_hand(x, w=None, b=None):
        # torch's group_norm refuses groups of one element: normalise by hand there
        g = x.reshape(x.shape[0], groups, -1)
        d = g - g.mean(-1, keepdim=True)
        y = (d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5)).reshape(x.shape)
        return y if w is None else y * w.reshape(1, c, 1, 1) + b.reshape(1, c, 1, 1)

    one_each = int(np.prod(xs[2:])) * (c // groups) == 1
    ref = by_hand if one_each else (lambda x, w=None, b=None: torch.nn.functional.group_norm(x, groups, w, b, 1e-5))
    check_vs_torch(torch, lambda x, w=None, b=None: F.nn.group_norm(x, groups, affine, w, b, 1e-5),
                   ref, arrays, rtol=1e-3, atol=5e-5)


@pytest.mark.parametrize("ishape, training, momentum, inplace", [((32, 16, 8, 8), True, 0.9, True),
                                                                 ((1, 16, 17, 128), True, 0.7, False),
                                                                 ((32, 16, 64, 5), False, 0.8, True)])
def test_batch_norm(ishape, training, momentum, inplace, torch):
    rng = np.random.default_rng(4)
    c = ishape[1]
    x = rng.standard_normal(ishape).astype(np.float32)
    rm = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    rv = np.abs(rng.standard_normal((1, c, 1, 1))).astype(np.float32)
    w = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    dy = rng.standard_normal(ishape).astype(np.float32)

    rm_t, rv_t = Tensor(rm), Tensor(rv)
    xs = [Tensor(v) for v in (x, w, b)]
    gm = GradManager().attach(xs)
    with gm:
        outs = F.batch_norm(xs[0], rm_t, rv_t, xs[1], xs[2], training=training, momentum=momentum, eps=1e-5,
                            inplace=inplace)
        y, new_rm, new_rv = (outs, rm_t, rv_t) if inplace else outs
        if training:
            gm.backward(y, Tensor(dy))

    # torch's momentum weighs the batch statistic, MegEngine's the running one
    t_rm, t_rv = torch.tensor(rm.reshape(-1).astype(np.float64)), torch.tensor(rv.reshape(-1).astype(np.float64))
    tx, tw, tb = (torch.tensor(v.astype(np.float64), requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.batch_norm(tx, t_rm, t_rv, tw.reshape(-1), tb.reshape(-1), training, 1 - momentum, 1e-5)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=5e-4)
    np.testing.assert_allclose(new_rm.numpy().reshape(-1), t_rm.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(new_rv.numpy().reshape(-1), t_rv.numpy(), rtol=1e-4, atol=1e-5)
    if training:
        ty.backward(torch.tensor(dy.astype(np.float64)))
        for got, want in zip(xs, (tx, tw, tb)):
            np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-3, atol=5e-4)
    if not inplace:
        np.testing.assert_array_equal(rm_t.numpy(), rm)     # the buffers are left alone
        np.testing.assert_array_equal(rv_t.numpy(), rv)


def test_argmax_argmin_over_all_minus_inf_or_inf():
    x = F.zeros((100, 100))
    x[:] = -float("inf")
    assert (F.argmax(x, axis=0).numpy() >= 0).all()
    x = F.zeros((100, 100))
    x[:] = float("inf")
    assert (F.argmin(x, axis=0).numpy() >= 0).all()


@pytest.mark.parametrize("val", [2, [2], [2, 3]])
def test_ones_of_a_tensor_shape(val):
    np.testing.assert_array_equal(F.ones(Tensor(val)).numpy(), np.ones(np.array(val)))


def test_negative_axes_of_argmax_and_argmin():
    x = np.random.default_rng(0).normal(0, 1, (32, 5))
    np.testing.assert_array_equal(F.argmax(Tensor(x), axis=-1).numpy(), F.argmax(Tensor(x), axis=1).numpy())
    for fn, np_fn in ((F.argmax, np.argmax), (F.argmin, np.argmin)):
        a = fn(Tensor(x), axis=(-1, -2)).numpy()
        np.testing.assert_array_equal(a, fn(Tensor(x), axis=(0, 1)).numpy())
        # MegEngine reduces several axes one after the other, the last first
        np.testing.assert_array_equal(a, np_fn(np_fn(x, axis=1), axis=0))


@pytest.mark.parametrize("mode, np_mode, kw, np_kw", [("CONSTANT", "constant", {}, {}),
                                                      ("CONSTANT", "constant", {"constant_value": 3},
                                                       {"constant_values": 3}),
                                                      ("EDGE", "edge", {}, {}), ("REFLECT", "reflect", {}, {})])
def test_pad(mode, np_mode, kw, np_kw, torch):
    src = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=np.float32)
    res = F.nn.pad(Tensor(src), ((2, 2), (2, 2)), mode, **kw)
    np.testing.assert_allclose(res.numpy(), np.pad(src, ((2, 2), (2, 2)), np_mode, **np_kw))
    t_mode = {"constant": "constant", "edge": "replicate", "reflect": "reflect"}[np_mode]
    check_vs_torch(torch, lambda t: F.nn.pad(t, ((2, 2), (2, 2)), mode, **kw),
                   lambda t: torch.nn.functional.pad(t[None, None], (2, 2, 2, 2), t_mode,
                                                     **({"value": 3.0} if kw else {}))[0, 0], [src])


def _pixel_shuffle_ref(data, r):
    lead = data.shape[:-3]
    c, h, w = data.shape[-3:]
    flat = data.reshape(-1, c, h, w)
    out = np.zeros((flat.shape[0], c // (r * r), h * r, w * r), data.dtype)
    for ch in range(c):
        oc, sub = divmod(ch, r * r)
        dy, dx = divmod(sub, r)
        out[:, oc, dy::r, dx::r] = flat[:, ch]
    return out.reshape(*lead, c // (r * r), h * r, w * r) if lead else out[0]


@pytest.mark.parametrize("shape, r", [((16, 3, 3), 4), ((3, 18, 3, 3), 3), ((5, 3, 20, 3, 4), 2),
                                      ((6, 5, 3, 25, 3, 4), 5), ((2, 3, 5, 3, 20, 3, 4), 2)])
def test_pixel_shuffle(shape, r):
    inp = np.arange(int(np.prod(shape))).reshape(shape)
    out = F.pixel_shuffle(Tensor(inp), upscale_factor=r)
    want = _pixel_shuffle_ref(inp, r)
    assert out.shape == want.shape
    np.testing.assert_array_equal(out.numpy(), want)


def test_pixel_shuffle_gradient(torch):
    check_vs_torch(torch, lambda t: F.pixel_shuffle(t, 2), lambda t: torch.nn.functional.pixel_shuffle(t, 2),
                   [randn(3, 4, 5, 5)])


# ==================================================================== test_loss.py
def test_cross_entropy_with_logits():
    data = Tensor([[0, 50], [0, -150]]).astype(np.float32)
    np.testing.assert_allclose(F.nn.cross_entropy(data, Tensor([1, 0]).astype(np.int32)).numpy(), 0.0)
    np.testing.assert_allclose(F.nn.cross_entropy(data, Tensor([0, 1]).astype(np.int32)).numpy(), 100)
    np.testing.assert_allclose(F.nn.cross_entropy(data, np.array([1, 0])).numpy(), 0.0)


def test_cross_entropy_of_probabilities(torch):
    rng = np.random.default_rng(8)
    x = (rng.random((5, 10)) - 0.5) * 4
    y = rng.integers(10, size=(5,))
    x[np.arange(5), y] += rng.random(5) * 2
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    want = np.mean(-np.log(p[np.arange(5), y]))
    got = F.nn.cross_entropy(Tensor(p, "float32"), Tensor(y, "int32"), with_logits=False)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    check_vs_torch(torch, lambda q, lab: F.nn.cross_entropy(q, lab, with_logits=False),
                   lambda q, lab: torch.nn.functional.nll_loss(torch.log(q), lab),
                   [p.astype(np.float32), y.astype(np.int32)])


def test_cross_entropy_reduction(torch):
    rng = np.random.default_rng(10)
    logits_np = rng.standard_normal((16, 10)).astype(np.float32)
    label_np = rng.integers(10, size=[16]).astype(np.int32)
    logits, label = Tensor(logits_np), Tensor(label_np)
    perm = rng.permutation(16)

    loss = F.nn.cross_entropy(logits, label, reduction="none")
    loss_perm = F.nn.cross_entropy(Tensor(logits_np[perm]), Tensor(label_np[perm]), reduction="none")
    np.testing.assert_allclose(loss.numpy()[perm], loss_perm.numpy())
    loss_sum = F.nn.cross_entropy(logits, label, reduction="sum")
    np.testing.assert_allclose(loss.numpy().sum(), loss_sum.numpy(), rtol=2e-7)
    loss_mean = F.nn.cross_entropy(logits, label, reduction="mean")
    np.testing.assert_allclose(loss_mean.numpy(), loss_sum.numpy() / 16, rtol=1e-7)
    smooth = F.nn.cross_entropy(logits, label, reduction="mean", label_smooth=0.1)
    smooth_none = F.nn.cross_entropy(logits, label, reduction="none", label_smooth=0.1)
    np.testing.assert_allclose(smooth.numpy(), smooth_none.numpy().mean(), rtol=2e-7)
    want = torch.nn.functional.cross_entropy(torch.tensor(logits_np, dtype=torch.float64),
                                             torch.tensor(label_np.astype(np.int64)), label_smoothing=0.1)
    np.testing.assert_allclose(smooth.numpy(), want.item(), rtol=1e-5)
    for bad in ("MEAN", "max"):
        with pytest.raises(ValueError):
            F.nn.cross_entropy(logits, label, reduction=bad)
    for reduction in ("none", "sum", "mean"):
        check_vs_torch(torch, lambda p, lab: F.nn.cross_entropy(p, lab, reduction=reduction, label_smooth=0.1),
                       lambda p, lab: torch.nn.functional.cross_entropy(p, lab, reduction=reduction,
                                                                        label_smoothing=0.1),
                       [logits_np, label_np])


def test_transpose_pattern_with_new_and_dropped_axes():
    x = gc.tensor(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(F.transpose(x, (1, "x", 0)).numpy(), np.arange(6.0).reshape(2, 3).T[:, None, :])
    assert F.transpose(gc.tensor(np.zeros((2, 1, 3))), (2, 0)).shape == (3, 2)
    with pytest.raises(TypeError, match=r"transpose: pattern entries must be ints"):
        F.transpose(x, (1.0, 0))
    with pytest.raises(ValueError, match="only axes of size 1 can be left out"):
        F.transpose(x, (1,))


def test_round_takes_halves_away_from_zero_as_megengine():
    """MegEngine's kernel is C's round and its documented example is
    F.round([1.5, 2.5, 3.5, 4.5]) = [2, 3, 4, 5] (NumPy and PyTorch round halves to even)."""
    x = np.array([1.5, 2.5, 3.5, 4.5, -0.5, -2.5, 0.49999999999999994, -0.0, np.inf, -np.inf, np.nan])
    got = F.round(Tensor(x)).numpy()
    np.testing.assert_array_equal(got, [2, 3, 4, 5, -1, -3, 0, -0.0, np.inf, -np.inf, np.nan])
    assert np.signbit(got[7]) and round(Tensor([2.5])).numpy().tolist() == [3.0]
    assert F.round(Tensor(np.array([3, -4], np.int32))).numpy().tolist() == [3, -4]
