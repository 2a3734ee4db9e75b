"""The indexing ops (ops/indexing.py) on cuda: Subtensor / SubtensorGrad /
SetSubtensor through Tensor indexing and setitem (basic and advanced NumPy
indexing), IndexingOneHot(Grad), Gather(Grad), Scatter, Sort and TopK through
the functional API; outputs, first- and second-order gradients against the
cpu, empty results, and out-of-range indices raising the cpu's error.

Index arrays are passed as tensors on the device (``matches_cpu`` puts every
array it is given there)."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore import _core
from gradcore.ops import indexing as I

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def ints(*a):
    return np.array(a, np.int64)


def apply1(op, *xs):
    return _core.apply(op, *xs)[0]


def assert_same_error(fn, arrays):
    """``fn`` raises on cuda the exception (type and message) it raises on cpu."""
    errors = []
    for device in ("cpu", "cuda"):
        with pytest.raises(Exception) as info:
            fn(*[gc.Tensor(np.asarray(a), device=device) for a in arrays])
        errors.append(info.value)
    cpu, cuda = errors
    assert type(cuda) is type(cpu), f"cuda raised {type(cuda).__name__}: {cuda}, cpu {type(cpu).__name__}: {cpu}"
    assert str(cuda) == str(cpu)
    return cpu


# ---------------------------------------------------------------- basic indexing (strided views)
BASIC = [
    pytest.param(1, id="int"),
    pytest.param(-1, id="neg-int"),
    pytest.param((1, -2, 0), id="ints-0d"),
    pytest.param((1, slice(None), 0), id="int-slice-int"),
    pytest.param((slice(1, None), 0), id="slice-int"),
    pytest.param(slice(None, None, 2), id="step"),
    pytest.param(slice(None, None, -1), id="neg-step"),
    pytest.param((slice(None), slice(3, 0, -2)), id="neg-step-2"),
    pytest.param((slice(-2, None), slice(None, -1)), id="neg-bounds"),
    pytest.param(None, id="none"),
    pytest.param((slice(None), None, slice(1, 3)), id="none-mid"),
    pytest.param((Ellipsis, 1), id="ellipsis"),
    pytest.param((0, Ellipsis, None), id="ellipsis-none"),
    pytest.param((Ellipsis, slice(None, None, -1), None), id="ellipsis-neg-step-none"),
    pytest.param(slice(2, 2), id="empty"),
    pytest.param((), id="all"),
]


@pytest.mark.parametrize("idx", BASIC)
def test_getitem_basic(cuda, matches_cpu, idx):
    matches_cpu(lambda x: x[idx] * x[idx], [rand(3, 4, 2)])


def test_getitem_basic_float64_ints_bool(cuda, matches_cpu):
    matches_cpu(lambda x: x[1:, ::-2] * 2, [rand(3, 4, dtype=np.float64)])
    matches_cpu(lambda x: x[::-1, 1], [np.arange(12, dtype=np.int32).reshape(3, 4)])
    matches_cpu(lambda x: x[:, None, 1:], [rng.random((2, 3)) > 0.5])


@pytest.mark.parametrize("shape,idx", [
    ((), ()), ((), None), ((), Ellipsis), ((1,), 0), ((1, 1), (0, slice(None))),
    ((0, 3), (slice(None), 1)), ((2, 0), (1,)), ((5,), slice(4, None, -2)),
])
def test_getitem_basic_shapes(cuda, matches_cpu, shape, idx):
    matches_cpu(lambda x: x[idx] * x[idx], [rand(*shape)])


def test_getitem_many_axes_merge_into_few(cuda, matches_cpu):
    # 9 axes (more than a kernel's gc_dims holds): size-1 and contiguous axes merge
    matches_cpu(lambda x: x[0, ..., None, 1:], [rand(2, 1, 2, 1, 2, 1, 2, 1, 3)])


# ---------------------------------------------------------------- advanced indexing (host offsets)
ADVANCED = [
    pytest.param(lambda x, i: x[i], [ints(0, 2, 2)], id="list-repeated"),
    pytest.param(lambda x, i: x[i], [ints(-1, 1)], id="negative"),
    pytest.param(lambda x, i: x[i], [np.array([[0, 1], [2, 2]], np.int32)], id="array-2d-int32"),
    pytest.param(lambda x, i: x[i], [np.array(1)], id="array-0d"),
    pytest.param(lambda x, i: x[1:, i], [ints(1, 1, 3)], id="slice-list"),
    pytest.param(lambda x, i, j: x[i, j], [ints(0, 1, 1), ints(1, 2, 2)], id="pair"),
    pytest.param(lambda x, i, j: x[i, j], [ints(0, 2).reshape(2, 1), ints(1, 3, 3)], id="pair-broadcast"),
    pytest.param(lambda x, i, j: x[i, ::-1, j], [ints(2, 0), ints(1, 0)], id="split-by-slice"),
    pytest.param(lambda x, i: x[i, 1:], [ints(2, 0)], id="array-slice"),
    pytest.param(lambda x, i: x[..., None, i], [ints(1, 0, 1)], id="ellipsis-none-list"),
    pytest.param(lambda x, m: x[m], [rng.random((3, 4)) > 0.4], id="mask-2d"),
    pytest.param(lambda x, m: x[m], [np.array([True, False, True])], id="mask-rows"),
    pytest.param(lambda x, m: x[:, m], [np.array([False, True, True, False])], id="mask-axis1"),
    pytest.param(lambda x, m, i: x[m, i], [np.array([True, False, True]), ints(3, 0)], id="mask-and-list"),
    pytest.param(lambda x, m: x[m], [np.zeros((3, 4), bool)], id="mask-empty"),
    pytest.param(lambda x, i: x[i], [np.zeros(0, np.int64)], id="list-empty"),
]


@pytest.mark.parametrize("fn,idx", ADVANCED)
def test_getitem_advanced(cuda, matches_cpu, fn, idx):
    # repeated indices accumulate in the gradient (atomicAdd)
    matches_cpu(lambda x, *i: fn(x, *i) * fn(x, *i), [rand(3, 4, 2)] + idx)


def test_getitem_advanced_float64_ints_and_0d(cuda, matches_cpu):
    matches_cpu(lambda x, i: x[i, 1] * x[i, 1], [rand(3, 4, dtype=np.float64), ints(2, 2, 0)])
    matches_cpu(lambda x, i: x[:, i], [np.arange(12, dtype=np.int64).reshape(3, 4), ints(3, 3, -4)])
    matches_cpu(lambda x, b: x[b] * x[b], [np.array(2.5, np.float32), np.array(True)])
    matches_cpu(lambda x, m: x[m] * 3, [rand(0, 3), np.zeros((0, 3), bool)])


def test_getitem_with_a_mask_computed_on_the_device(cuda, matches_cpu):
    matches_cpu(lambda x: x[x > 0] * x[x > 0], [rand(4, 5)])


def test_getitem_with_a_0d_int_tensor(cuda, matches_cpu):
    matches_cpu(lambda x, i: x[i, 1:] * x[i, 1:], [rand(3, 4), np.array(-1)])


@pytest.mark.parametrize("fn,arrays", [
    pytest.param(lambda x, i: x[i], [rand(3, 4), ints(0, 3)], id="row-3-of-3"),
    pytest.param(lambda x, i: x[:, i], [rand(3, 4), ints(-5)], id="negative"),
    pytest.param(lambda x, i: x[i], [rand(0, 2), ints(0)], id="empty-axis"),
    pytest.param(lambda x, m: x[m], [rand(3, 4), np.ones(2, bool)], id="mask-shape"),
    pytest.param(lambda x: x[3], [rand(3, 4)], id="int"),
    pytest.param(lambda x: x[0, 0, 0], [rand(3, 4)], id="too-many"),
])
def test_getitem_errors(cuda, fn, arrays):
    err = assert_same_error(fn, arrays)
    assert isinstance(err, IndexError)


@pytest.mark.parametrize("index", [
    (1, slice(None), 0), (slice(None, None, -1), None, slice(3, 0, -2)), (Ellipsis, 1), (0, 1, 1), (),
    ([2, 0, 2],), (slice(None), [[1], [3]], [0, 1]), ([1, 0], slice(None, None, -1), [1, 1]),
    (np.array([True, False, True]), Ellipsis, None), (rng.random((3, 4)) > 0.5, 1),
])
def test_host_offsets_match_numpy(index):
    # the host side of the launchers: the strided view of a basic index, the
    # flat offsets of an advanced one, against indexing an arange
    shape = (3, 4, 2)
    flat = np.arange(24).reshape(shape)
    spec, arrays = I.split_index(index)
    want = flat[index]
    if arrays:
        np.testing.assert_array_equal(I._flat_offsets(shape, spec, [np.asarray(a) for a in arrays]), want)
    else:
        vshape, strides, base = I._basic_view(shape, spec)
        assert vshape == want.shape
        got = np.lib.stride_tricks.as_strided(flat.reshape(-1)[base:], vshape, [s * 8 for s in strides])
        np.testing.assert_array_equal(got, want)
    assert I._compact((2, 1, 3, 4), (12, 0, 4, 1), (0, 0, 0, 1)) == ((6, 4), [(4, 1), (0, 1)])


def test_subtensor_grad_direct(cuda):
    # SubtensorGrad on its own, with a broadcast gradient and a repeated index
    for spec, idx, g in [(I.split_index((slice(None, None, -1), 1))[0], [], rand(3)),
                         (I.split_index(([0, 0, 2],))[0], [ints(0, 0, 2)], rand(3, 4))]:
        op = I.SubtensorGrad(spec)
        ref = rand(3, 4)
        want = op.cpu(g, ref, *idx)
        got = apply1(op, gc.Tensor(g, device="cuda"), gc.Tensor(ref, device="cuda"),
                     *[gc.Tensor(i, device="cuda") for i in idx])
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_subtensor_last_only_direct(cuda):
    # the gradient of an assigned value: of a repeated position the last element only
    spec = I.split_index((slice(None), [2, 0, 2, 2]))[0]
    op = I.Subtensor(spec, last_only=True)
    x, idx = rand(3, 4), ints(2, 0, 2, 2)
    want = op.cpu(x, idx)
    assert (want[:, :3] == 0).sum() == 6 and (want[:, 1] == x[:, 0]).all()
    got = apply1(op, gc.Tensor(x, device="cuda"), gc.Tensor(idx, device="cuda"))
    np.testing.assert_array_equal(got.numpy(), want)


# ---------------------------------------------------------------- setitem
SETITEM = [
    pytest.param(lambda y, v: F.setitem(y, (slice(1, None), 0), v), (2,), [], id="slice-int"),
    pytest.param(lambda y, v: F.setitem(y, (Ellipsis, slice(None, None, -2)), v), (4, 1), [], id="neg-step-bcast"),
    pytest.param(lambda y, v: F.setitem(y, (0, None), v), (), [], id="none-scalar"),
    pytest.param(lambda y, v: F.setitem(y, slice(3, 3), v), (4, 2), [], id="empty"),
    pytest.param(lambda y, v, i: F.setitem(y, i, v), (3, 4, 2), [ints(0, 0, 2)], id="repeated-last-wins"),
    pytest.param(lambda y, v, i: F.setitem(y, (slice(None), i), v), (2,), [ints(-1, 1)], id="list-bcast"),
    pytest.param(lambda y, v, i, j: F.setitem(y, (i, j), v), (2, 1, 2), [ints(0, 2).reshape(2, 1), ints(1, 3, 3)],
                 id="pair-broadcast"),
    pytest.param(lambda y, v, m: F.setitem(y, m, v), (2,), [rng.random((3, 4)) > 0.4], id="mask"),
    pytest.param(lambda y, v, m: F.setitem(y, m, v), (2,), [np.zeros((3, 4), bool)], id="mask-empty"),
    # a value with more (size-1) leading dims than the part: the second order sums
    # to, and broadcasts back from, that shape (the program fuzzer's case)
    pytest.param(lambda y, v: F.setitem(y, (-2, Ellipsis, slice(None)), v), (1, 1, 4, 2), [], id="extra-leading-1s"),
    pytest.param(lambda y, v, i: F.setitem(y, i, v), (1, 1, 4, 1), [ints(0, 2)], id="extra-leading-1s-advanced"),
]


@pytest.mark.parametrize("fn,vshape,idx", SETITEM)
def test_setitem(cuda, matches_cpu, fn, vshape, idx):
    matches_cpu(lambda x, v, *i: fn(x * x, v * v, *i) * x, [rand(3, 4, 2), rand(*vshape)] + idx)


def test_setitem_operator(cuda, matches_cpu):
    def fn(x, v, w, m):
        y = x * 1
        y[1:, ::-1] = v          # Tensor.__setitem__, broadcasting v
        y[m] = w                 # a 0-d value
        return y * x
    matches_cpu(fn, [rand(3, 4), rand(4), np.array(0.5, np.float32), rng.random((3, 4)) > 0.5])


def test_setitem_float64_ints_casts(cuda, matches_cpu):
    matches_cpu(lambda x, v, i: F.setitem(x, i, v) * x, [rand(3, 4, dtype=np.float64), rand(4, dtype=np.float64),
                                                         ints(2, 0)])
    matches_cpu(lambda x, v, i: F.setitem(x, (i, 1), v), [np.arange(12, dtype=np.int32).reshape(3, 4),
                                                          np.array(7, np.int64), ints(1)])
    matches_cpu(lambda x, v: F.setitem(x, (0,), v), [rand(2, 3), np.arange(3, dtype=np.int32)])
    matches_cpu(lambda x, v: F.setitem(x, (), v) * x, [np.array(1.5, np.float32), np.array(2.0, np.float32)])


@pytest.mark.parametrize("fn,arrays", [
    pytest.param(lambda x, v, i: F.setitem(x, i, v), [rand(3, 4), rand(2), ints(0, 3)], id="out-of-range"),
    pytest.param(lambda x, v, m: F.setitem(x, m, v), [rand(3, 4), rand(3), np.eye(3, 4, dtype=bool)[:, ::-1].copy()
                                                      | np.eye(3, 4, dtype=bool)], id="mask-value-shape"),
    pytest.param(lambda x, v, i: F.setitem(x, i, v), [rand(3, 4), rand(3, 4), ints(0, 1)], id="value-shape"),
])
def test_setitem_errors(cuda, fn, arrays):
    assert_same_error(fn, arrays)


# ---------------------------------------------------------------- indexing_one_hot (and cross_entropy)
@pytest.mark.parametrize("shape,axis,keepdims,index", [
    ((3, 5), 1, False, ints(0, 4, 2)),
    ((3, 5), -1, True, np.array([4, 0, 3], np.int32)),
    ((4, 3), 0, True, ints(3, 0, 1)),
    ((2, 3, 4), 1, False, rng.integers(0, 3, (2, 4))),
    ((2, 3, 4), 2, True, rng.integers(0, 4, (2, 3)).astype(np.uint8)),
    ((5,), 0, False, np.array(2)),
    ((0, 4), 1, False, np.zeros(0, np.int64)),
])
def test_indexing_one_hot(cuda, matches_cpu, shape, axis, keepdims, index):
    matches_cpu(lambda x, i: F.indexing_one_hot(x * x, i, axis, keepdims), [rand(*shape), index])


def test_indexing_one_hot_float64_and_ints(cuda, matches_cpu):
    matches_cpu(lambda x, i: F.indexing_one_hot(x * x, i), [rand(3, 4, dtype=np.float64), ints(3, 0, 0)])
    matches_cpu(lambda x, i: F.indexing_one_hot(x, i, 0), [np.arange(12, dtype=np.int32).reshape(3, 4),
                                                           ints(2, 0, 1, 1)])


@pytest.mark.parametrize("x,index", [
    pytest.param(rand(3, 4), ints(0, 4, 1), id="too-large"),
    pytest.param(rand(3, 4), ints(-5, 0, 1), id="too-small"),
    pytest.param(rand(3, 4), ints(-1, 0, 1), id="negative"),     # MegEngine: [0, n) only
    pytest.param(rand(3, 4), ints(0, 1), id="shape"),
    pytest.param(rand(3, 4), np.array([0.5, 1.0, 2.0]), id="dtype"),    # whole floats are accepted
])
def test_indexing_one_hot_errors(cuda, x, index):
    assert_same_error(lambda x, i: F.indexing_one_hot(x, i), [x, index])


def test_cross_entropy(cuda, matches_cpu):
    matches_cpu(lambda x, y: F.cross_entropy(x, y), [rand(4, 5), ints(0, 4, 4, 2)])
    matches_cpu(lambda x, y: F.cross_entropy(x, y, axis=1, reduction="sum", label_smooth=0.1),
                [rand(2, 3, 4, dtype=np.float64), rng.integers(0, 3, (2, 4))])


def test_indexing_one_hot_grad_direct(cuda):
    op = I.IndexingOneHotGrad(1, False)
    g, ref, index = rand(3, 2), rand(3, 4, 2), np.array([[0, -1], [3, 2], [1, 1]], np.int32)
    got = apply1(op, *[gc.Tensor(a, device="cuda") for a in (g, ref, index)])
    np.testing.assert_array_equal(got.numpy(), op.cpu(g, ref, index % 4))


# ---------------------------------------------------------------- gather / scatter
@pytest.mark.parametrize("xshape,ishape,axis", [
    ((3, 5, 4), (2, 6, 3), 1), ((3, 5), (3, 5), 0), ((3, 5), (2, 7), -1), ((4,), (6,), 0),
    ((3, 5), (0, 2), 1), ((3, 0), (3, 0), 0), ((1, 1, 1), (1, 3, 1), 1),
])
def test_gather(cuda, matches_cpu, xshape, ishape, axis):
    n = xshape[axis]
    index = rng.integers(-n, n, ishape) if n else np.zeros(ishape, np.int64)
    matches_cpu(lambda x, i: F.gather(x * x, axis, i), [rand(*xshape), index])


def test_gather_float64_ints(cuda, matches_cpu):
    matches_cpu(lambda x, i: F.gather(x * x, 1, i), [rand(2, 3, dtype=np.float64),
                                                     np.array([[2, 2, 2, 0], [1, 0, 1, 0]], np.int32)])
    matches_cpu(lambda x, i: F.gather(x, 0, i), [np.arange(6, dtype=np.int64).reshape(3, 2),
                                                 ints(2, 0, 1).reshape(3, 1)])


@pytest.mark.parametrize("fn,arrays", [
    pytest.param(lambda x, i: F.gather(x, 1, i), [rand(3, 4), ints(0, 4).reshape(1, 2)], id="range"),
    pytest.param(lambda x, i: F.gather(x, 1, i), [rand(3, 4), ints(0, -5).reshape(1, 2)], id="negative-range"),
    pytest.param(lambda x, i: F.gather(x, 1, i), [rand(3, 4), ints(0, 1)], id="rank"),
    pytest.param(lambda x, i: F.gather(x, 0, i), [rand(3, 4), ints(0, 1, 2, 0, 1).reshape(1, 5)], id="too-big"),
    pytest.param(lambda x, i: F.gather(x, 2, i), [rand(3, 4), ints(0).reshape(1, 1)], id="axis"),
    pytest.param(lambda x, i: F.gather(x, 0, i), [np.array(1.0), np.array(0)], id="0d"),
])
def test_gather_errors(cuda, fn, arrays):
    assert_same_error(fn, arrays)


def _scatter_case(xshape, ishape, axis, repeats):
    n = xshape[axis]
    if repeats:
        return rng.integers(-n, n, ishape)
    # a permutation's prefix along the axis: no position written twice
    perm = np.argsort(rng.random(ishape[:axis] + (n,) + ishape[axis + 1:]), axis=axis)
    return np.take(perm, np.arange(ishape[axis]), axis=axis)


@pytest.mark.parametrize("xshape,ishape,axis,repeats", [
    ((3, 5, 4), (2, 3, 3), 1, False), ((3, 5), (2, 5), 0, False), ((3, 5), (3, 4), -1, True),
    ((4,), (6,), 0, True), ((3, 5), (0, 5), 0, False), ((2, 3), (2, 0), 1, False),
])
def test_scatter(cuda, matches_cpu, xshape, ishape, axis, repeats):
    index = _scatter_case(xshape, ishape, axis, repeats)
    matches_cpu(lambda x, i, s: F.scatter(x * x, axis, i, s * s) * x, [rand(*xshape), index, rand(*ishape)])


def test_scatter_float64_ints_casts(cuda, matches_cpu):
    matches_cpu(lambda x, i, s: F.scatter(x, 1, i, s) * x, [rand(2, 3, dtype=np.float64), ints(2, 0).reshape(1, 2),
                                                            rand(1, 2, dtype=np.float64)])
    matches_cpu(lambda x, i, s: F.scatter(x, 0, i, s), [np.zeros((3, 2), np.int32), ints(2, 0).reshape(1, 2),
                                                        np.array([[5, 6]], np.int32)])


@pytest.mark.parametrize("fn,arrays", [
    pytest.param(lambda x, i, s: F.scatter(x, 1, i, s), [rand(3, 4), ints(0, 4).reshape(1, 2), rand(1, 2)],
                 id="range"),
    pytest.param(lambda x, i, s: F.scatter(x, 1, i, s), [rand(3, 4), ints(0, 1).reshape(1, 2), rand(2, 1)],
                 id="source-shape"),
    pytest.param(lambda x, i, s: F.scatter(x, 1, i, s), [rand(3, 4), np.zeros((1, 2)), rand(1, 2)], id="dtype"),
])
def test_scatter_errors(cuda, fn, arrays):
    assert_same_error(fn, arrays)


# ---------------------------------------------------------------- sort / topk
def _with_ties(*shape, dtype=np.float32):
    x = rand(*shape, dtype=dtype)
    flat = x.reshape(-1, shape[-1]) if x.size else x
    if flat.size and shape[-1] > 2:
        flat[:, :3] = flat[:, :1]      # equal values: stable order on both devices
        flat[0, -1] = flat[0, 0]
    return x


@pytest.mark.parametrize("shape", [(7,), (3, 6), (2, 3, 5), (4, 1), (0, 3), (3, 0)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(cuda, matches_cpu, shape, descending):
    matches_cpu(lambda x: (lambda v, i: (v * v, i))(*F.sort(x * 1, descending)), [_with_ties(*shape)])


def test_sort_float64_ints_bool_nan(cuda, matches_cpu):
    matches_cpu(lambda x: F.sort(x * x, True), [_with_ties(3, 5, dtype=np.float64)])
    matches_cpu(lambda x: F.sort(x), [rng.integers(-3, 3, (3, 8)).astype(np.int32)])
    matches_cpu(lambda x: F.sort(x, True), [rng.integers(-3, 3, (3, 8)).astype(np.int64)])
    matches_cpu(lambda x: F.sort(x, True), [rng.random((2, 7)) > 0.5])
    x = np.array([[1.0, np.nan, -0.0, 0.0, np.nan, -np.inf, 2.0, np.inf, 0.0]], np.float32)
    for descending in (False, True):
        matches_cpu(lambda t: F.sort(t, descending), [x], second_order=False)


@pytest.mark.parametrize("k,descending,kth_only,no_sort", [
    (1, False, False, False), (3, True, False, False), (6, False, False, False), (0, False, False, False),
    (3, False, False, True), (3, True, False, True), (1, False, True, False), (4, True, True, False),
])
def test_topk(cuda, matches_cpu, k, descending, kth_only, no_sort):
    matches_cpu(lambda x: (lambda v, i: (v * v, i))(*F.topk(x * 1, k, descending, kth_only, no_sort)),
                [_with_ties(3, 6)])


def test_topk_shapes_and_dtypes(cuda, matches_cpu):
    matches_cpu(lambda x: F.topk(x * x, 2, True), [_with_ties(2, 3, 5, dtype=np.float64)])
    matches_cpu(lambda x: F.topk(x * x, 1, kth_only=True), [rand(5)])
    matches_cpu(lambda x: F.topk(x, 2), [rand(0, 4)])
    matches_cpu(lambda x: F.topk(x, 3, True, no_sort=True), [rng.integers(-2, 2, (4, 6)).astype(np.int32)])
    x = np.array([[np.nan, 1.0, np.nan, -1.0, 3.0]], np.float32)
    for descending in (False, True):
        matches_cpu(lambda t: F.topk(t, 4, descending), [x], second_order=False)


@pytest.mark.parametrize("fn,arrays", [
    pytest.param(lambda x: F.sort(x), [np.array(1.0, np.float32)], id="sort-0d"),
    pytest.param(lambda x: F.topk(x, 5), [rand(3, 4)], id="topk-k"),
    pytest.param(lambda x: F.topk(x, 0, kth_only=True), [rand(3, 4)], id="topk-kth-0"),
    pytest.param(lambda x: F.topk(x, 1), [np.array(1.0, np.float32)], id="topk-0d"),
])
def test_sort_topk_errors(cuda, fn, arrays):
    assert_same_error(fn, arrays)


# the attributes (k, mode, descending) are kernel arguments: one source, one compile per C type
SORT_CONFIGS = [I.Sort(False), I.Sort(True)] + [I.TopK(k, d, m) for k, d in ((1, True), (3, False))
                                                for m in I.TOPK_MODES]


@pytest.mark.parametrize("ctype", ["float", "double", "int"])
def test_sort_topk_one_source_per_ctype(ctype):
    for cls in (I.Sort, I.TopK):
        ops = [op for op in SORT_CONFIGS if type(op) is cls]
        assert len({op.cuda_source(ctype) for op in ops}) == 1, cls.__name__


def test_sort_topk_compile_once(fresh_backend):
    """Every configuration runs (and matches the cpu) on a new backend; each
    class's source is loaded (compiled, on the emulator) once."""
    be, loads = fresh_backend
    driver = be.driver
    x = _with_ties(3, 5)
    for op in SORT_CONFIGS:
        for got, want in zip(op.cuda(be, be.to_device(x)), op.cpu(x)):
            np.testing.assert_array_equal(got.get(), want, err_msg=repr(op))
    assert sorted(loads) == sorted({op.cuda_source("float") for op in SORT_CONFIGS})
    if driver.kind == "emulator":
        assert driver.stats["compiles"] == 2


# ---------------------------------------------------------------- host-side index constants and values
# (made on the input's device by gradcore.functional)
def test_literal_list_and_array_indices(cuda, matches_cpu):
    matches_cpu(lambda x: x[[0, 2, 2]] * x[1:, 0].sum(), [rand(3, 4)])
    matches_cpu(lambda x: F.gather(x, 1, np.array([[0, 0], [1, 0]])), [rand(2, 3)])


def test_setitem_python_scalar(cuda, matches_cpu):
    def fn(x):
        y = x * 1
        y[1:, ::-1] = 0.5
        return y * x
    matches_cpu(fn, [rand(3, 4)])
