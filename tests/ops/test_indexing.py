"""Indexing: basic (ints, slices with steps, None, Ellipsis, negative),
advanced (integer lists and arrays, repeated indices that accumulate,
boolean masks), index assignment on a recorded tensor, and
indexing_one_hot. Values against NumPy, gradients against finite
differences (first and second order) and PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore.testing import gradgradcheck

SHAPE = (3, 4, 2)
MASK = np.array([[True, False, True, True], [False, False, True, False], [True, True, False, False]])

# (id, index in NumPy form, torch supports it)
INDICES = [
    ("int", 1, True),
    ("neg-int", -1, True),
    ("ints", (1, -2, 0), True),                       # a 0-d result
    ("slice", slice(1, 3), True),
    ("slice-step", slice(None, None, 2), True),
    ("slice-neg-bounds", (slice(-2, None), slice(None, -1)), True),
    ("slice-neg-step", slice(None, None, -1), False),  # torch has no negative steps
    ("slice-neg-step-2", (slice(None), slice(3, 0, -2)), False),
    ("mixed", (1, slice(None), 0), True),
    ("none", None, True),
    ("none-mid", (slice(None), None, slice(1, 3)), True),
    ("ellipsis", (Ellipsis, 1), True),
    ("ellipsis-none", (0, Ellipsis, None), True),
    ("empty-slice", slice(2, 2), True),
    ("list", [0, 2], True),
    ("list-repeated", [0, 0, 2, 0], True),             # repeated rows accumulate
    ("list-negative", [-1, 1], True),
    ("array-2d", np.array([[0, 1], [2, 2]]), True),
    ("list-axis1", (slice(None), [1, 1, 3]), True),
    ("pair", ([0, 1, 1], [1, 2, 2]), True),            # paired, with a repeat
    ("pair-broadcast", (np.array([[0], [2]]), np.array([1, 3, 3])), True),
    ("array-then-slice", ([2, 0], slice(1, None)), True),
    ("ellipsis-list", (Ellipsis, [1, 0, 1]), True),
    ("bool-mask", MASK, True),
    ("bool-rows", np.array([True, False, True]), True),
    ("bool-axis1", (slice(None), np.array([False, True, True, False])), True),
]

PARAMS = [pytest.param(idx, ok, id=name) for name, idx, ok in INDICES]


def to_torch_index(torch, idx):
    def conv(i):
        if isinstance(i, (list, np.ndarray)):
            a = np.asarray(i)
            return torch.tensor(a if a.dtype == bool else a.astype(np.int64))
        return i
    return tuple(conv(i) for i in idx) if isinstance(idx, tuple) else conv(idx)


def sample(rng, shape=SHAPE, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("idx, torch_ok", PARAMS)
def test_values(idx, torch_ok, rng):
    x = sample(rng)
    out = gradcore.Tensor(x)[idx]
    ref = x[idx]
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out.numpy(), ref)


@pytest.mark.parametrize("idx, torch_ok", PARAMS)
def test_gradcheck(idx, torch_ok, rng, h):
    h.check_grads(lambda t: t[idx], [sample(rng)], second=False)


@pytest.mark.parametrize("idx, torch_ok", PARAMS)
def test_gradgradcheck(idx, torch_ok, rng):
    assert gradgradcheck(lambda t: t[idx] * t[idx], [gradcore.Tensor(sample(rng))])


@pytest.mark.parametrize("idx, torch_ok", PARAMS)
def test_vs_torch(idx, torch_ok, rng, h, torch):
    if not torch_ok:
        pytest.skip("torch does not support this index")
    tidx = to_torch_index(torch, idx)
    h.compare(torch, lambda t: t[idx], lambda t: t[tidx], [sample(rng)])


def test_repeated_indices_accumulate(h):
    x = np.arange(4.0)
    _, grads, _ = h.gc_vjp(lambda t: t[[1, 1, 1, 3]], [x], weight=np.array([1.0, 2.0, 4.0, 8.0]))
    np.testing.assert_array_equal(grads[0], [0.0, 7.0, 0.0, 8.0])


def test_index_with_tensors(rng, h, torch):
    x = sample(rng)
    i = gradcore.Tensor(np.array([2, 0, 2]))
    k = gradcore.Tensor(np.array(1))                    # a 0-d integer tensor is an int
    h.compare(torch, lambda t: t[i, k], lambda t: t[torch.tensor([2, 0, 2]), 1], [x])


def test_index_on_0d_and_1d(h, torch):
    h.compare(torch, lambda t: t[None], lambda t: t[None], [np.array(1.5)])
    h.compare(torch, lambda t: t[...], lambda t: t[...], [np.array(1.5)])
    h.compare(torch, lambda t: t[0], lambda t: t[0], [np.array([2.5])])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("idx", [(1, slice(None, None, 2)), [0, 0, 2], MASK], ids=["basic", "list", "mask"])
def test_dtype(dtype, idx, rng, h):
    x = sample(rng, dtype=dtype)
    out, grads, _ = h.gc_vjp(lambda t: t[idx], [x])
    assert out.dtype == np.dtype(dtype) and grads[0].dtype == np.dtype(dtype)


# ---- index assignment on a recorded tensor
# (id, index, value shape, torch supports it)
SETS = [
    ("int", 1, (4,), True),
    ("int-broadcast", 1, (), True),
    ("slice", (slice(None), slice(1, 3)), (3, 2), True),
    ("slice-broadcast", (slice(None), slice(1, 3)), (2,), True),
    ("slice-step", (slice(None, None, 2), 0), (2,), True),
    ("slice-neg-step", (slice(None), slice(None, None, -2)), (3, 1), False),
    ("ellipsis", (Ellipsis, -1), (3,), True),
    ("list", [0, 2], (2, 4), True),
    ("list-broadcast", [0, 2], (1, 4), True),
    ("pair", ([0, 2], [1, 3]), (2,), True),
    ("mask", MASK[:, :4], (6,), True),
    ("mask-broadcast", MASK[:, :4], (), True),
    ("bool-rows", np.array([True, False, True]), (4,), True),
]
SET_PARAMS = [pytest.param(idx, vshape, ok, id=name) for name, idx, vshape, ok in SETS]


def _assign_gc(idx):
    def fn(x, v):
        y = x * 1.0            # a recorded tensor, not a leaf
        y[idx] = v
        return y
    return fn


def _assign_torch(idx):
    def fn(x, v):
        y = x * 1.0
        y[idx] = v
        return y
    return fn


@pytest.mark.parametrize("idx, vshape, torch_ok", SET_PARAMS)
def test_setitem_values(idx, vshape, torch_ok, rng):
    x, v = rng.standard_normal((3, 4)), rng.standard_normal(vshape)
    out = _assign_gc(idx)(gradcore.Tensor(x), gradcore.Tensor(v))
    ref = x.copy()
    ref[idx] = v
    np.testing.assert_array_equal(out.numpy(), ref)


@pytest.mark.parametrize("idx, vshape, torch_ok", SET_PARAMS)
def test_setitem_gradcheck(idx, vshape, torch_ok, rng, h):
    x, v = rng.standard_normal((3, 4)), rng.standard_normal(vshape)
    h.check_grads(_assign_gc(idx), [x, v], second=False)


@pytest.mark.parametrize("idx, vshape, torch_ok", SET_PARAMS)
def test_setitem_gradgradcheck(idx, vshape, torch_ok, rng):
    x, v = rng.standard_normal((3, 4)), rng.standard_normal(vshape)
    fn = _assign_gc(idx)
    assert gradgradcheck(lambda a, b: fn(a, b) * fn(a, b), [gradcore.Tensor(x), gradcore.Tensor(v)])


@pytest.mark.parametrize("idx, vshape, torch_ok", SET_PARAMS)
def test_setitem_vs_torch(idx, vshape, torch_ok, rng, h, torch):
    if not torch_ok:
        pytest.skip("torch does not support this index")
    x, v = rng.standard_normal((3, 4)), rng.standard_normal(vshape)
    h.compare(torch, _assign_gc(idx), _assign_torch(to_torch_index(torch, idx)), [x, v])


def test_setitem_python_scalar_and_dtype(h):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    def fn(t):
        y = t * 2
        y[:, 1] = 0.5
        return y
    out, grads, w = h.gc_vjp(fn, [x])
    assert out.dtype == np.float32 and grads[0].dtype == np.float32
    np.testing.assert_array_equal(out[:, 1], [0.5, 0.5])
    np.testing.assert_allclose(grads[0], 2 * w * np.array([1, 0, 1], np.float32))


def test_setitem_keeps_earlier_reads_valid():
    """A value read before the assignment keeps its value and its gradient."""
    x = gradcore.Tensor(np.array([1.0, 2.0, 3.0]))
    v = gradcore.Tensor(np.array(10.0))
    gm = gradcore.GradManager().attach([x, v])
    with gm:
        y = x * 1.0
        before = y * y                 # reads y before the write
        y[1] = v
        loss = F.sum(before) + F.sum(y * 3.0)
        gm.backward(loss)
    np.testing.assert_array_equal(before.numpy(), [1.0, 4.0, 9.0])
    np.testing.assert_allclose(x.grad.numpy(), [2 * 1 + 3, 2 * 2, 2 * 3 + 3])
    np.testing.assert_allclose(v.grad.numpy(), 3.0)


@pytest.mark.parametrize("idx, vshape", [(1, ()), ((slice(None), [0, 2]), (3, 1)), (MASK[:, :4], ())],
                         ids=["int", "list", "mask"])
def test_setitem_on_an_attached_tensor(idx, vshape, rng, h, torch):
    """Writing into an attached tensor: it is rebound to the result, and its
    gradient is that of the tensor before the write (zero where overwritten),
    as torch gives for a clone of it."""
    def gfn(x, v):
        x[idx] = v
        return x * x

    def tfn(x, v):
        y = x.clone()
        y[to_torch_index(torch, idx)] = v
        return y * y
    h.compare(torch, gfn, tfn, [rng.standard_normal((3, 4)), rng.standard_normal(vshape)])


# ---- indexing_one_hot
@pytest.mark.parametrize("shape, axis, keepdims", [
    ((4, 3), 1, False), ((4, 3), 1, True), ((3, 4), 0, False), ((2, 3, 4), 1, False),
    ((2, 3, 4), -1, True),
])
def test_indexing_one_hot(shape, axis, keepdims, rng, h, torch):
    x = rng.standard_normal(shape)
    ax = axis % len(shape)
    idx = rng.integers(0, shape[ax], shape[:ax] + shape[ax + 1:])
    fn = lambda t, i: F.indexing_one_hot(t, i, axis, keepdims)

    def tfn(t, i):
        out = torch.gather(t, ax, i.unsqueeze(ax))
        return out if keepdims else out.squeeze(ax)
    h.compare(torch, fn, tfn, [x, idx])
    h.check_grads(lambda t: fn(t, gradcore.Tensor(idx)) ** 2, [x])


# ---- bad input
def test_index_out_of_range(h):
    x = gradcore.Tensor(np.ones((3, 2)))
    with pytest.raises(IndexError) as ei:
        x[5]
    h.check_error(ei, "Subtensor", "(3, 2)")


def test_index_array_out_of_range(h):
    x = gradcore.Tensor(np.ones((3, 2)))
    with pytest.raises(IndexError) as ei:
        x[[0, 7]]
    h.check_error(ei, "Subtensor", "(3, 2)")


def test_too_many_indices(h):
    x = gradcore.Tensor(np.ones((3, 2)))
    with pytest.raises(IndexError) as ei:
        x[0, 0, 0]
    h.check_error(ei, "Subtensor", "(3, 2)")


def test_float_index_array(h):
    x = gradcore.Tensor(np.ones((3, 2)))
    with pytest.raises((ValueError, IndexError, TypeError)) as ei:
        x[np.array([0.0, 1.0])]
    h.check_error(ei, "Subtensor", "(3, 2)")


def test_non_integer_index_is_an_index_error(h):
    # NumPy raises IndexError for a float, string or object index, and a
    # TypeError for a float slice bound (never truncated to an int)
    x = gradcore.Tensor(np.ones((3, 2)))
    for idx in (1.0, [0, 1.5], gradcore.Tensor([1.0]), "a", [0, None]):
        with pytest.raises(IndexError) as ei:
            x[idx]
        h.check_error(ei, "Subtensor", "(3, 2)", "valid indices")
    for idx in (slice(0.5, 2), slice(0, 2, 1.0), (slice(None), slice(None, 1.0))):
        with pytest.raises(TypeError):
            x[idx]
        with pytest.raises(TypeError):
            x[idx] = 0.0
    # integer-like bounds still work: NumPy ints and 0-d integer tensors
    np.testing.assert_array_equal(x[np.int64(1):gradcore.Tensor(3)].numpy(), np.ones((2, 2)))


def test_setitem_shape_mismatch(h):
    x = gradcore.Tensor(np.ones((3, 4)))
    gm = gradcore.GradManager().attach([x])
    with gm:
        y = x * 1.0
        with pytest.raises(ValueError) as ei:
            y[0] = gradcore.Tensor(np.ones(3))
    h.check_error(ei, "SetSubtensor", "(3, 4)", "(3,)")


def test_indexing_one_hot_bad_index_shape(h):
    x = gradcore.Tensor(np.ones((4, 3)))
    with pytest.raises(ValueError) as ei:
        F.indexing_one_hot(x, gradcore.Tensor(np.zeros(3, np.int32)))
    h.check_error(ei, "IndexingOneHot", "(4, 3)", "(3,)")
