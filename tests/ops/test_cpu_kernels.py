"""gradcore/cpu/_kernels.pyx and the op paths that use it give NumPy's
results bit for bit (the formulations they replaced), including the cases
that fall back to NumPy."""
import math

import numpy as np
import pytest

from gradcore.cpu import _kernels as K
from gradcore.ops import elemwise as ew
from gradcore.ops import indexing as ix


def _specials(a):
    a = a.copy()
    a[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -88.5]
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_same_bits_as_numpy_formula(dtype):
    x = _specials((np.random.default_rng(0).standard_normal(10_001) * 30).astype(dtype))
    e = np.exp(-np.abs(x))
    want = np.where(x >= 0, 1, e) / (1 + e)
    got = ew._sigmoid(x)
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    # a strided input takes NumPy's path, same values
    assert np.array_equal(ew._sigmoid(x[::2]), want[::2], equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_is_numpy_maximum(dtype):
    x = _specials(np.random.default_rng(8).standard_normal(4_001).astype(dtype))
    x[100:200] = -0.0
    relu = ew.Elemwise("relu").cpu
    for a in (x, x[::2]):
        want = np.maximum(a, 0)
        assert np.array_equal(relu(a).view(np.uint8), want.view(np.uint8))
    assert relu(np.array([-1, 2], np.int32)).tolist() == [0, 2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_is_math_erf(dtype):
    x = _specials((np.random.default_rng(1).standard_normal(5_001) * 3).astype(dtype))
    want = np.array([math.erf(v) for v in x.astype(np.float64)]).astype(dtype)
    assert np.array_equal(ew._erf(x), want, equal_nan=True)
    assert np.array_equal(ew._erf(x[::3]), want[::3], equal_nan=True)


def test_erf_float32_vector_path_over_the_whole_range():
    # float32 bit patterns spread over every exponent, both signs, a length
    # that leaves a scalar tail
    u = np.arange(0, 0x7F800000, 104_729, dtype=np.uint32)
    x = np.concatenate([u.view(np.float32), -u.view(np.float32), np.float32([np.nan, np.inf, -np.inf])])
    want = np.frompyfunc(math.erf, 1, 1)(x).astype(np.float32)
    assert np.array_equal(ew._erf(x), want, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_select_matches_where(dtype):
    rng = np.random.default_rng(2)
    x = _specials(rng.standard_normal(1_003).astype(dtype))
    y = rng.standard_normal(1_003).astype(dtype)
    c = rng.random(1_003) > 0.5
    for a, b in [(x, y), (x, 0), (0, x), (2.5, y), (x, np.zeros((), dtype)), (x, x)]:
        want = np.where(c, a, b)
        got = ew._where(c, a, b)
        assert got.dtype == want.dtype
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    # what the kernel does not take: NumPy's answer all the same
    assert K.select(c, x, np.zeros((), np.float64 if dtype == np.float32 else np.float32)) is None
    assert K.select(c, x[::-1], y) is None and K.select(c[::-1], x, y) is None
    assert np.array_equal(ew._where(c[::-1], x[::-1], y), np.where(c[::-1], x[::-1], y), equal_nan=True)
    assert K.select(c, np.arange(1_003), y) is None
    assert np.array_equal(ew._where(c, np.arange(1_003), 0), np.where(c, np.arange(1_003), 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_add_is_add_at(dtype):
    rng = np.random.default_rng(3)
    off = rng.integers(0, 50, 2_000).astype(np.int64)
    src = rng.standard_normal(2_000).astype(dtype)
    want = np.zeros(50, dtype)
    np.add.at(want, off, src)
    got = np.zeros(50, dtype)
    assert K.scatter_add(got, off, src)
    assert np.array_equal(got, want)
    with pytest.raises(IndexError, match="out of range"):
        K.scatter_add(np.zeros(50, dtype), off + 1, src)
    assert not K.scatter_add(np.zeros(50, np.int32), off, src)


def test_last_writes_keeps_the_last_of_each_offset():
    off = np.array([3, 1, 3, 0, 1, 3], np.int64)
    assert K.last_writes(off, 4).tolist() == [False, False, False, True, True, True]
    with pytest.raises(IndexError, match="out of range"):
        K.last_writes(off, 3)


def test_topk_partition_path_matches_full_sort():
    rng = np.random.default_rng(4)
    for trial in range(400):
        shape = tuple(rng.integers(1, 4, rng.integers(0, 3))) + (int(rng.integers(8, 80)),)
        kind = trial % 3
        if kind == 0:
            x = rng.standard_normal(shape).astype(np.float32)
        elif kind == 1:   # many ties at the k-th key
            x = rng.integers(0, 3, shape).astype(np.float32)
        else:
            x = rng.integers(-2, 2, shape).astype(np.float64)
            x[rng.random(shape) < 0.2] = np.nan
        k = int(rng.integers(1, shape[-1] // 4))
        for desc in (False, True):
            for mode in ("sorted", "no_sort", "kth_only"):
                op = ix.TopK(k, desc, mode)
                order = ix._order(x, desc)[..., :k]
                want = order[..., k - 1] if mode == "kth_only" else (
                    np.sort(order, -1) if mode == "no_sort" else order)
                vals, ind = op.cpu(x)
                assert np.array_equal(ind, want.astype(np.int32)), (x, k, desc, mode)
                assert np.array_equal(vals, np.take_along_axis(x, want[..., None] if mode == "kth_only" else want,
                                                               -1).reshape(vals.shape), equal_nan=True)


def test_gather_scatter_flat_paths_match_along_axis():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 5, 4))
    for ax in range(3):
        shape = list(x.shape)
        shape[ax] = 6
        shape[(ax + 1) % 3] -= 1          # index smaller than x outside the axis
        index = rng.integers(0, x.shape[ax], shape)
        region = tuple(slice(None) if d == ax else slice(0, s) for d, s in enumerate(shape))
        for xin in (x, np.asfortranarray(x)):
            got = ix.Gather(ax).cpu(xin, index)
            assert np.array_equal(got, np.take_along_axis(x[region], index, ax))
        g = rng.standard_normal(shape)
        want = np.zeros_like(x)
        grid = list(np.ogrid[tuple(slice(0, s) for s in shape)])
        grid[ax] = index
        np.add.at(want[region], tuple(grid), g)
        assert np.array_equal(ix.GatherGrad(ax).cpu(g, x, index), want)
        want = x.copy()
        np.put_along_axis(want[region], index, g, ax)
        assert np.array_equal(ix.Scatter(ax).cpu(x, index, g), want)


# Standardize / StandardizeBackward: internal ops of layer, group and general
# norm (not registered: they run on cuda by their decomposition, and standard
# ops bring a cuda_source), so their gradient cases live here
@pytest.mark.parametrize("axes, shape", [((1,), (3, 5)), ((0, 2), (2, 3, 4)), ((2,), (2, 2, 6))])
def test_standardize_gradients_first_and_second_order(axes, shape):
    import gradcore
    from gradcore.core import apply
    from gradcore.ops.nn import Standardize, StandardizeBackward
    from gradcore.testing import gradcheck, gradgradcheck
    rng = np.random.default_rng(6)
    x = gradcore.Tensor(rng.standard_normal(shape))
    both = lambda t: apply(Standardize(axes, 1e-3), t)                 # y and s: s's gradient too
    only_y = lambda t: apply(Standardize(axes, 1e-3), t)[0]
    for fn in (both, only_y):
        assert gradcheck(fn, [x], atol=1e-6, rtol=1e-4)
        assert gradgradcheck(fn, [x], atol=1e-5, rtol=1e-3)
    g, y = (gradcore.Tensor(rng.standard_normal(shape)) for _ in range(2))
    kept = tuple(1 if d in axes else n for d, n in enumerate(shape))
    gs, s = gradcore.Tensor(rng.standard_normal(kept)), gradcore.Tensor(rng.uniform(0.5, 1.5, kept))
    back = lambda *t: apply(StandardizeBackward(axes, 1e-3), *t)[0]
    assert gradcheck(back, [g, gs, y, s], atol=1e-6, rtol=1e-4)
    assert gradgradcheck(back, [g, gs, y, s], atol=1e-5, rtol=1e-3)


def test_standardize_cpu_matches_its_decomposition():
    from gradcore.op import Composite
    from gradcore.ops.nn import Standardize, StandardizeBackward
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((4, 6, 5)).astype(dtype)
        op = Standardize((1, 2), 1e-5)
        y, s = op.cpu(x)
        y0, s0 = Composite.cpu(op, x)
        np.testing.assert_allclose(y, y0, rtol=2e-6 if dtype == np.float32 else 1e-14, atol=1e-6)
        np.testing.assert_allclose(s, s0, rtol=2e-6 if dtype == np.float32 else 1e-14)
        g = rng.standard_normal(x.shape).astype(dtype)
        back = StandardizeBackward((1, 2), 1e-5)
        # s's gradient zero (its term skipped) and not
        for gs in (np.zeros_like(s), rng.standard_normal(s.shape).astype(dtype)):
            np.testing.assert_allclose(back.cpu(g, gs, y, s), Composite.cpu(back, g, gs, y, s),
                                       rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("zero_stats", [True, False])
def test_batch_norm_backward_cpu_adds_the_statistics_terms_as_its_decomposition(zero_stats):
    # float32 runs oneDNN's backward plus the mean's and invstd's terms only
    # where their gradients are not zero: both cases against the float64
    # decomposition (the generic ops)
    from gradcore.op import Composite
    from gradcore.ops.nn import BatchNormBackward
    rng = np.random.default_rng(8)
    shape, pshape = (4, 3, 5, 2), (1, 3, 1, 1)
    g, x = (rng.standard_normal(shape) for _ in range(2))
    gm, gi, w, m = (rng.standard_normal(pshape) * (0.0 if k < 2 and zero_stats else 1.0) for k in range(4))
    invstd = rng.uniform(0.5, 1.5, pshape)
    op = BatchNormBackward(1e-5, 4)
    want = Composite.cpu(op, g, gm, gi, x, w, m, invstd)
    got = op.cpu(*(a.astype(np.float32) for a in (g, gm, gi, x, w, m, invstd)))
    for a, b in zip(got, want):
        assert a.dtype == np.float32 and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    if not zero_stats:      # the terms matter: without them dx differs
        bare = Composite.cpu(op, g, 0 * gm, 0 * gi, x, w, m, invstd)[0]
        assert not np.allclose(bare, want[0], rtol=1e-4, atol=1e-5)


def test_subtensor_grad_rows_and_offsets_paths_are_add_at():
    from gradcore.ops.indexing import build_index, split_index
    rng = np.random.default_rng(9)
    x = rng.standard_normal((50, 7, 3))
    items = [np.array([3, -1, 3, 0]), rng.integers(-50, 50, (6, 4)), (np.array([1, 2]), slice(None)),
             (np.array([1, 2]), Ellipsis), (slice(None), np.array([1, 1, 2])), (np.array([1, 2]), np.array([0, 3])),
             (np.array([4, 4]), slice(None), np.array([2, 0]))]
    for item in items:
        spec, arrays = split_index(item)
        g = rng.standard_normal(x[item].shape)
        want = np.zeros_like(x)
        np.add.at(want, item, g)
        assert np.array_equal(ix.SubtensorGrad(spec).cpu(g, x, *arrays), want), item
    rows = ix._leading_rows(build_index(*split_index(np.array([0, -1]))), x.shape)
    assert rows.tolist() == [0, 49]
    with pytest.raises(IndexError, match="out of range"):
        K.scatter_add_rows(np.zeros((3, 2)), np.array([3], np.int64), np.ones((1, 2)))


def test_in_place_paths_leave_integer_and_0d_inputs_to_numpy():
    from gradcore.ops.nn import LogSoftmax, Softmax
    ints = np.array([-2, 0, 3], np.int32)
    e = np.exp(-np.abs(ints))
    assert np.array_equal(ew._sigmoid(ints), np.where(ints >= 0, 1, e) / (1 + e))
    for op, want in ((Softmax(-1), 1.0), (LogSoftmax(-1), 0.0)):
        assert float(op.cpu(np.float32(2.5))) == want           # 0-d: NumPy hands back a scalar
        z = ints - ints.max()
        ref = np.exp(z) / np.exp(z).sum() if want else z - np.log(np.exp(z).sum())
        np.testing.assert_allclose(op.cpu(ints), ref)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("shape", [(3, 1), (2, 5), (4, 3, 17), (1, 1024)])
def test_standardize_rows_and_its_backward_match_the_decomposition(dtype, tol, shape):
    from gradcore.cpu._kernels import standardize_rows, standardize_rows_backward
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    n = shape[-1]
    y, s = standardize_rows(x, n, 1e-5)
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(-1, keepdims=True)
    s64 = np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(s, s64.reshape(-1), rtol=tol, atol=tol)
    np.testing.assert_allclose(y, d / s64, rtol=tol * 10, atol=tol * 10)
    g = rng.standard_normal(shape).astype(dtype)
    dx = standardize_rows_backward(g, y, s, n)
    y64, g64 = y.astype(np.float64), g.astype(np.float64)
    ref = (g64 - g64.mean(-1, keepdims=True) - y64 * (g64 * y64).mean(-1, keepdims=True)) / s.astype(np.float64).reshape(
        shape[:-1] + (1,))
    np.testing.assert_allclose(dx, ref, rtol=tol * 10, atol=tol * 10)
    # not its case: strided, integer, a row length that does not divide the size
    assert standardize_rows(x[..., ::2], n, 1e-5) is None or n == 1
    assert standardize_rows(x.astype(np.int32), n, 1e-5) is None
    assert standardize_rows(x, 7, 1e-5) is None or x.size % 7 == 0


def test_standardize_op_takes_the_row_kernel_for_trailing_axes_only():
    import gradcore.ops.nn as nn_ops
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4))
    for axes in [(2,), (1, 2), (0, 2), (1,)]:
        y, s = nn_ops.Standardize(axes, 1e-3).cpu(x)
        d = x - x.mean(axes, keepdims=True)
        s_ref = np.sqrt((d * d).mean(axes, keepdims=True) + 1e-3)
        assert s.shape == s_ref.shape
        np.testing.assert_allclose(y, d / s_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s, s_ref, rtol=1e-12)
        g = rng.standard_normal(x.shape)
        gs = rng.standard_normal(s.shape)
        dx = nn_ops.StandardizeBackward(axes, 1e-3).cpu(g, gs, y, s)
        m = x.size // s.size
        ref = (g - g.mean(axes, keepdims=True) - y * (g * y).mean(axes, keepdims=True)) / s + y * gs / m
        np.testing.assert_allclose(dx, ref, rtol=1e-12, atol=1e-12)


# StandardizeAffine / StandardizeAffineBackward: layer and group norm with
# their per-channel scale and shift, one op (its kernel scales in its pass)
@pytest.mark.parametrize("axes, x_shape, w_shape", [((1,), (3, 5), (5,)), ((2, 3), (2, 2, 3, 2), (1, 2, 3, 1)),
                                                    ((1, 2), (2, 3, 4), (3, 4)), ((0, 2), (2, 3, 4), (1, 3, 1))])
def test_standardize_affine_gradients_first_and_second_order(axes, x_shape, w_shape):
    import gradcore
    from gradcore.core import apply
    from gradcore.ops.nn import StandardizeAffine
    from gradcore.testing import gradcheck, gradgradcheck
    rng = np.random.default_rng(10)
    x = gradcore.Tensor(rng.standard_normal(x_shape))
    w, b = (gradcore.Tensor(rng.standard_normal(w_shape)) for _ in range(2))
    # every output (the mean and the deviation too), and the first alone
    every = lambda *t: apply(StandardizeAffine(axes, 1e-3), *t)
    first = lambda *t: apply(StandardizeAffine(axes, 1e-3), *t)[0]
    for fn in (every, first):
        assert gradcheck(fn, [x, w, b], atol=1e-6, rtol=1e-4)
        assert gradgradcheck(fn, [x, w, b], atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape, w_shape, axes", [((4, 6, 5), (6, 5), (1, 2)), ((3, 4, 2, 7), (1, 4, 2, 1), (2, 3)),
                                                    ((2, 2, 3, 1), (1, 2, 3, 1), (2, 3)), ((5, 9), (9,), (1,)),
                                                    ((4, 9), (4, 1), (1,))])
def test_standardize_affine_row_kernels_match_the_decomposition(dtype, x_shape, w_shape, axes):
    from gradcore.op import Composite
    from gradcore.ops.nn import StandardizeAffine, StandardizeAffineBackward, _affine_plan
    assert _affine_plan(axes, x_shape, w_shape)         # the kernels' case, not the fallback
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(x_shape) * 3 + 1).astype(dtype)
    w, b = (rng.standard_normal(w_shape).astype(dtype) for _ in range(2))
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    op = StandardizeAffine(axes, 1e-5)
    outs, want = op.cpu(x, w, b), Composite.cpu(op, x, w, b)
    for u, v in zip(outs, want):
        assert u.shape == v.shape and u.dtype == dtype
        np.testing.assert_allclose(u, v, **tol)
    _, m, s = outs
    g = rng.standard_normal(x_shape).astype(dtype)
    gm, gs = (rng.standard_normal(m.shape).astype(dtype) for _ in range(2))
    back = StandardizeAffineBackward(axes, 1e-5)
    for u, v in zip(back.cpu(g, gm, gs, x, w, m, s), Composite.cpu(back, g, gm, gs, x, w, m, s)):
        assert u.shape == v.shape and u.dtype == dtype
        np.testing.assert_allclose(u, v, **tol)


def test_affine_plan_takes_layer_and_group_norm_layouts_only():
    from gradcore.ops.nn import _affine_plan
    assert _affine_plan((1,), (8, 16), (16,)) == (16, 1, 1)                       # layer norm
    assert _affine_plan((2, 3), (2, 4, 3, 5), (1, 4, 3, 1)) == (15, 4, 5)         # group norm's view
    assert _affine_plan((1, 2), (2, 3, 4), (3, 1)) == (12, 1, 4)                  # per channel, one group
    assert _affine_plan((1,), (8, 16), (8, 1)) == (16, 8, 16)                     # one scale per row
    assert _affine_plan((2,), (2, 3, 4), (2, 1, 4)) is None                       # per row, not its last axes
    assert _affine_plan((0,), (8, 16), (8, 1)) is None                            # not the trailing axes
    assert _affine_plan((1, 2), (2, 3, 4), (1, 4)) is None                        # varies within a channel
    assert _norm_affine_refuses_what_is_not_rows()


def _norm_affine_refuses_what_is_not_rows():
    """The kernels refuse what they cannot read as rows (the op then decomposes)."""
    x = np.ones((4, 6), np.float32)
    w = np.ones(6, np.float32)
    return (K.norm_affine(x[:, ::2], w[:3], w[:3], 3, 1, 1, 1e-5) is None
            and K.norm_affine(x, w, w.astype(np.float64), 6, 1, 1, 1e-5) is None
            and K.norm_affine(x, w[:5], w[:5], 6, 1, 1, 1e-5) is None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(64, 33), (3, 4, 5), (7,), (2, 1, 3)])
def test_cumsum_kernel_is_numpys_bits_on_every_axis_both_ways(dtype, shape):
    from gradcore.ops.reduce import CumSum
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(shape) * 1e3).astype(dtype)
    x.flat[0] = -0.0                      # kept as -0.0 (0 + -0.0 would be +0.0)
    for axis in range(len(shape)):
        for reverse in (False, True):
            want = np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis) if reverse else np.cumsum(x, axis=axis)
            got = CumSum(axis, reverse).cpu(x)
            assert got.dtype == dtype and got.tobytes() == np.ascontiguousarray(want).tobytes(), (axis, reverse)
    assert K.cumsum(x[..., ::2], 1, x[..., ::2].size, 1, False) is None          # strided: NumPy's
    assert K.cumsum(x.astype(np.int32), 1, x.size, 1, False) is None             # integers: NumPy's


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("shape, ax", [((5, 7), 1), ((5, 7), 0), ((3, 4, 6), 1), ((2, 3, 4, 5), 2), ((1, 1), 1)])
def test_one_hot_pick_and_put_are_take_and_put_along_axis(dtype, itype, shape, ax):
    from gradcore.ops.indexing import IndexingOneHot, IndexingOneHotGrad
    rng = np.random.default_rng(10)
    x = rng.standard_normal(shape).astype(dtype)
    ishape = shape[:ax] + shape[ax + 1:]
    index = rng.integers(0, shape[ax], ishape).astype(itype)
    outer, n, inner = int(np.prod(shape[:ax])), shape[ax], int(np.prod(shape[ax + 1:]))
    want = np.take_along_axis(x, np.expand_dims(index, ax), ax)
    got = K.one_hot_pick(x, index, outer, n, inner)
    assert got.dtype == dtype and np.array_equal(got, want.reshape(-1))
    for keepdims in (False, True):
        y = IndexingOneHot(ax, keepdims).cpu(x, index)
        assert np.array_equal(y, want if keepdims else np.squeeze(want, ax))
        g = rng.standard_normal(y.shape).astype(dtype)
        ref = np.zeros(shape, dtype)
        np.put_along_axis(ref, np.expand_dims(index, ax), g if keepdims else np.expand_dims(g, ax), ax)
        assert np.array_equal(IndexingOneHotGrad(ax, keepdims).cpu(g, x, index), ref)
    # an index outside [0, n) in either direction: the kernels decline, the op names it
    for bad in (-1, n):
        wrong = index.copy()
        wrong.reshape(-1)[-1] = bad
        assert K.one_hot_pick(x, wrong, outer, n, inner) is None
        assert K.one_hot_put(want.reshape(-1), wrong, outer, n, inner) is None
        with pytest.raises(IndexError, match="IndexingOneHot: index"):
            IndexingOneHot(ax).cpu(x, wrong)
    # not their case: strided, an integer x, a float index
    assert K.one_hot_pick(np.asfortranarray(x) if x.ndim > 1 and min(shape) > 1 else x[..., ::1].astype(int),
                          index, outer, n, inner) is None
    assert K.one_hot_pick(x, index.astype(np.float32), outer, n, inner) is None
