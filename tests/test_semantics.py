"""Small API semantics pinned to MegEngine's: axes given as 0-d integer
tensors, split's arguments, reshape and BatchNorm of empty tensors, one
exception type for indices out of range, negative indices in gather /
scatter (counted from the end) and indexing_one_hot (refused), and the
gradient of an index assignment whose value broadcast."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
from gradcore import IndexOpError, OpError
from gradcore.autodiff import GradManager
from oracle import error_of


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


X = np.random.default_rng(0).normal(size=(3, 4, 5))


# ---------------------------------------------------------------- axis as a 0-d integer tensor
@pytest.mark.parametrize("fn", [
    lambda x, a: F.sum(x, axis=a), lambda x, a: F.mean(x, axis=a), lambda x, a: F.max(x, axis=a),
    lambda x, a: F.min(x, axis=a), lambda x, a: F.prod(x, axis=a), lambda x, a: F.argmax(x, axis=a),
    lambda x, a: F.argmin(x, axis=a), lambda x, a: F.var(x, axis=a), lambda x, a: F.std(x, axis=a),
    lambda x, a: F.norm(x, axis=a), lambda x, a: F.cumsum(x, axis=a), lambda x, a: F.logsumexp(x, axis=a),
    lambda x, a: F.softmax(x, axis=a), lambda x, a: x.sum(axis=a), lambda x, a: x.mean(axis=a),
    lambda x, a: F.sort(x, axis=a)[0], lambda x, a: F.sort(x, axis=a)[1],
], ids=["sum", "mean", "max", "min", "prod", "argmax", "argmin", "var", "std", "norm", "cumsum",
        "logsumexp", "softmax", "Tensor.sum", "Tensor.mean", "sort", "sort-indices"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_axis_may_be_a_0d_integer_tensor(fn, axis):
    x = gc.tensor(X)
    want = fn(x, axis)
    got = fn(x, gc.tensor(axis))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_topk_and_argsort_work_on_the_last_axis_and_take_k_as_a_tensor(torch):
    x = gc.tensor(X)
    values, indices = F.topk(x, gc.tensor(2), descending=True)
    tv, ti = torch.topk(torch.tensor(X), 2, dim=-1)
    np.testing.assert_array_equal(values.numpy(), tv.numpy())
    np.testing.assert_array_equal(indices.numpy(), ti.numpy())
    np.testing.assert_array_equal(F.argsort(x).numpy(), np.argsort(X, axis=-1, kind="stable"))


def test_a_float_axis_tensor_is_refused_by_name():
    with pytest.raises(TypeError, match="sort: axis must be an int"):
        F.sort(gc.tensor(X), axis=gc.tensor(1.0))
    with pytest.raises(TypeError, match=r"Reduce\(sum\): axis must be an int"):
        F.sum(gc.tensor(X), axis=gc.tensor(0.5))


# ---------------------------------------------------------------- split
def test_split_follows_megengine():
    x = gc.tensor(np.arange(20.0).reshape(2, 10))
    # a count that does not divide: the first pieces one longer (MegEngine's own test: 20 / 3 -> 7, 7, 6)
    assert [p.shape for p in F.split(gc.tensor(np.zeros((10, 20))), 3, axis=-1)] == [(10, 7), (10, 7), (10, 6)]
    assert [p.shape for p in F.split(x, [6, 6, 9], axis=1)] == [(2, 6), (2, 0), (2, 3), (2, 1)]
    for bad, needle in (([6, 3], r"\(6, 3\)"), ([2, 11], r"\(2, 11\)"), (11, "11 sections"), (0, "got 0")):
        with pytest.raises(ValueError, match=needle) as info:
            F.split(x, bad, axis=1)
        assert "Split" in str(info.value)


# ---------------------------------------------------------------- empty tensors
@pytest.mark.parametrize("shape, target, want", [
    ((0, 4), (-1, 4), (0, 4)), ((0, 4), (2, -1, 2), (2, 0, 2)), ((4, 0), (-1,), (0,)),
    ((3, 0, 2), (6, -1), (6, 0)),
])
def test_reshape_of_empty_tensors_with_minus_one(shape, target, want):
    x = gc.tensor(np.zeros(shape, "float32"))
    assert x.reshape(target).shape == want and F.reshape(x, target).shape == want
    gm = GradManager().attach(x)
    with gm:
        gm.backward(F.reshape(x, target).sum())
    assert x.grad.shape == shape


def test_reshape_refuses_float_sizes_by_name():
    x = gc.tensor(np.zeros(6, "float32"))
    for fn in (lambda: x.reshape((2.0, 3)), lambda: F.reshape(x, (2.0, 3)), lambda: x.reshape(2.0, 3)):
        with pytest.raises(TypeError, match="reshape"):
            fn()


@pytest.mark.parametrize("make, shape", [(M.BatchNorm1d, (0, 4)), (M.BatchNorm1d, (0, 4, 3)),
                                         (M.BatchNorm2d, (0, 4, 2, 2))])
def test_batch_norm_training_on_an_empty_batch_returns_it(make, shape):
    bn = make(4)
    x = gc.tensor(np.zeros(shape, "float32"))
    y = bn(x)
    assert y.shape == shape and y is not x
    np.testing.assert_array_equal(bn.running_mean.numpy(), 0)     # statistics untouched (not NaN)
    np.testing.assert_array_equal(bn.running_var.numpy(), 1)
    bn.eval()
    assert bn(x).shape == shape


def test_softmax_of_an_empty_axis_is_empty(torch):
    x = np.zeros((3, 0), "float32")
    for axis in (0, 1):
        assert F.softmax(gc.tensor(x), axis=axis).shape == (3, 0)
        assert F.log_softmax(gc.tensor(x), axis=axis).shape == (3, 0)
        assert tuple(torch.softmax(torch.tensor(x), axis).shape) == (3, 0)


# ---------------------------------------------------------------- indices out of range: one type
@pytest.mark.parametrize("fn", [
    lambda x: x[3], lambda x: x[-4], lambda x: x[:, 7], lambda x: x[[0, 3]], lambda x: x[gc.tensor([0, 5])],
    lambda x: x[[0, 1], [0, 9]], lambda x: F.gather(x, 1, gc.tensor([[0, 4]] * 3)),
    lambda x: F.gather(x, 0, gc.tensor([[-4, 0, 0, 0]])),
    lambda x: F.scatter(x, 1, gc.tensor([[0, 9, 1, 2]] * 3), x),
    lambda x: F.indexing_one_hot(x, gc.tensor([0, 4, 1]), 1),
    lambda x: F.indexing_one_hot(x, gc.tensor([0, -1, 1]), 1),
], ids=["basic", "basic-negative", "basic-axis1", "advanced-list", "advanced-tensor", "advanced-two",
        "gather", "gather-negative", "scatter", "one_hot", "one_hot-negative"])
@pytest.mark.parametrize("record", [False, True])
def test_an_index_out_of_range_is_one_exception_type(fn, record):
    info = error_of(fn, gc.tensor(np.arange(12.0).reshape(3, 4)), record, IndexOpError)
    assert isinstance(info.value, IndexError) and isinstance(info.value, OpError)
    assert "out of" in str(info.value) and "(3, 4)" in str(info.value)


def test_index_assignment_out_of_range_is_the_same_type():
    x = gc.tensor(np.zeros((3, 4)))
    with pytest.raises(IndexOpError):
        x[5] = 1.0
    with pytest.raises(IndexOpError):
        x[[0, 7]] = 1.0


# ---------------------------------------------------------------- negative indices
def test_gather_and_scatter_count_negative_indices_from_the_end(torch):
    """MegEngine's gather and scatter are advanced indexing, which counts a
    negative index from the end (megdnn IndexingMultiAxisVec: idx += size)."""
    x_np = np.random.default_rng(1).normal(size=(3, 4))
    pos = np.array([[0, 3, 1], [2, 2, 0], [3, 1, 1]])
    neg = pos - 4                                      # the same elements, counted from the end
    results = {}
    for name, index in (("pos", pos), ("neg", neg)):
        x = gc.tensor(x_np)
        src = gc.tensor(np.arange(9.0).reshape(3, 3))
        gm = GradManager().attach([x, src])
        with gm:
            g = F.gather(x, 1, gc.tensor(index))
            s = F.scatter(x, 1, gc.tensor(index[:, :1]), src[:, :1])
            gm.backward((g * g).sum() + (s * s).sum())
        results[name] = (g.numpy(), s.numpy(), x.grad.numpy(), src.grad.numpy())
    for a, b in zip(results["pos"], results["neg"]):
        np.testing.assert_array_equal(a, b)
    tx = torch.tensor(x_np)
    np.testing.assert_array_equal(results["neg"][0], torch.gather(tx, 1, torch.tensor(pos)).numpy())


def test_indexing_one_hot_refuses_negative_indices():
    """MegEngine's IndexingOneHot asserts 0 <= index < n (no counting from
    the end); non-negative indices work, a negative one is IndexOpError."""
    x = gc.tensor(np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(F.indexing_one_hot(x, gc.tensor([3, 0, 1]), 1).numpy(), [3.0, 4.0, 9.0])
    with pytest.raises(IndexOpError, match=r"index -1 out of range.*negative ones are not counted"):
        F.indexing_one_hot(x, gc.tensor([3, -1, 1]), 1)
    with pytest.raises(ValueError, match="cross_entropy"):
        F.cross_entropy(x, gc.tensor([0, -1, 2]))


def test_basic_and_advanced_indexing_count_negative_indices_from_the_end():
    x_np = np.arange(12.0).reshape(3, 4)
    x = gc.tensor(x_np)
    np.testing.assert_array_equal(x[-1].numpy(), x_np[-1])
    np.testing.assert_array_equal(x[[-1, 0]].numpy(), x_np[[-1, 0]])
    np.testing.assert_array_equal(x[:, gc.tensor([-2])].numpy(), x_np[:, [-2]])


# ---------------------------------------------------------------- index assignment gradients
@pytest.mark.parametrize("target, index, value_shape", [
    ((3,), np.s_[:1], (1, 1)),
    ((3,), np.s_[:2], (1, 1, 1)),
    ((2, 3), np.s_[:, 1:], (1, 2, 1)),
    ((2, 3), np.s_[1], (1, 1, 3)),
    ((2, 3), np.s_[[0, 1], 0], (1, 2)),
    ((2, 3), np.s_[0], (1,)),
])
def test_index_assignment_gradient_comes_back_in_the_values_shape(torch, target, index, value_shape):
    rng = np.random.default_rng(2)
    a_np, b_np, w_np = rng.normal(size=target), rng.normal(size=value_shape), rng.normal(size=target)
    a, b = gc.tensor(a_np), gc.tensor(b_np)
    gm = GradManager().attach([a, b])
    with gm:
        c = a * 1.0
        c[index] = b
        gm.backward((c * gc.tensor(w_np)).sum())
    ta, tb = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    tc = ta * 1.0
    tc[index] = tb
    (tc * torch.tensor(w_np)).sum().backward()
    np.testing.assert_allclose(c.numpy(), tc.detach().numpy())
    assert b.grad.shape == value_shape
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
