"""CUDA launchers of the reductions (ops/reduce.py): Reduce (every mode,
axis None / int / tuple, adjacent or not, keepdims), BroadcastBack (their
gradient), ArgReduce and CumSum, against the cpu, with first- and
second-order gradients."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.op import OpError
from gradcore import dtypes
from gradcore.ops import reduce as red
from gradcore.ops.reduce import ArgReduce, BroadcastBack, CumSum, Reduce

MODES = ("sum", "mean", "max", "min", "prod")
FN = {"sum": F.sum, "mean": F.mean, "max": F.max, "min": F.min, "prod": F.prod}
AXES = (None, 0, -1, 1, (0, 2), (2, 0), (1, 3), (0, 1, 3), (-3, -1), ())


def _x(shape, dtype=np.float32, lo=0.5, hi=1.5, seed=0):
    # away from 0 (prod's gradient divides) and without ties (max/min)
    rng = np.random.default_rng(seed)
    return (rng.uniform(lo, hi, shape) * rng.choice([-1, 1], shape)).astype(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_axes(cuda, matches_cpu, mode, keepdims):
    x = _x((2, 3, 2, 3))
    for axis in AXES:
        matches_cpu(lambda t: FN[mode](t, axis=axis, keepdims=keepdims), [x])


@pytest.mark.parametrize("mode", MODES)
def test_reduce_small_shapes(cuda, matches_cpu, mode):
    fn = FN[mode]
    matches_cpu(lambda t: fn(t), [np.asarray(1.25, np.float32)])                 # 0-d
    matches_cpu(lambda t: fn(t, axis=0), [np.asarray(-0.75, np.float32)])
    matches_cpu(lambda t: fn(t, axis=-1, keepdims=True), [np.asarray(0.5, np.float32)])
    matches_cpu(lambda t: fn(t, axis=1), [_x((3, 1))])                           # size-1 axis
    matches_cpu(lambda t: fn(t, axis=(0, 2), keepdims=True), [_x((1, 4, 1))])
    matches_cpu(lambda t: fn(t), [_x((1,))])
    # reduced inside a broadcast expression (the core sums broadcast gradients)
    matches_cpu(lambda a, b: fn(a * b, axis=0), [_x((3, 4)), _x((4,), seed=1)])


@pytest.mark.parametrize("mode", ["sum", "mean", "prod"])
@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")
def test_reduce_empty(cuda, matches_cpu, mode):
    fn = FN[mode]
    with np.errstate(all="ignore"):
        matches_cpu(lambda t: fn(t, axis=0), [np.zeros((0, 3), np.float32)])      # reduce an empty axis
        matches_cpu(lambda t: fn(t, axis=1), [np.zeros((0, 3), np.float32)])      # empty output
        matches_cpu(lambda t: fn(t), [np.zeros((2, 0), np.float32)])
        matches_cpu(lambda t: fn(t, axis=(0, 2), keepdims=True), [np.zeros((2, 0, 3), np.float32)])


@pytest.mark.parametrize("mode", ["max", "min"])
def test_max_min_empty_raise(cuda, mode):
    for x in (gc.Tensor(np.zeros((0, 3), np.float32), device="cuda"), gc.Tensor(np.zeros((0,)), device="cuda")):
        with pytest.raises(OpError, match="empty"):
            FN[mode](x, axis=0)
    with pytest.raises(OpError, match="out of range"):
        F.sum(gc.Tensor(np.zeros((2, 3), np.float32), device="cuda"), axis=2)


@pytest.mark.parametrize("mode", MODES)
def test_reduce_long_axis_chunks(cuda, matches_cpu, mode, monkeypatch):
    # a long axis with few outputs is reduced in several launches
    monkeypatch.setattr(red, "_SERIAL", 4)
    x = _x((3, 37, 2), np.float64, 0.9, 1.1)
    for axis in (None, 1, (0, 1), (0, 2)):
        matches_cpu(lambda t: FN[mode](t, axis=axis), [x], rtol=1e-10, atol=1e-12)


def test_reduce_long_axis_default_chunks(cuda, matches_cpu):
    x = _x((600,), np.float32)
    for mode in ("sum", "mean", "max", "min"):
        matches_cpu(lambda t: FN[mode](t), [x], second_order=False)
    matches_cpu(lambda t: F.sum(t, axis=1), [_x((2, 300))])


@pytest.mark.parametrize("mode", MODES)
def test_reduce_float64(cuda, matches_cpu, mode):
    x = _x((3, 4, 2), np.float64)
    for axis in (None, 1, (0, 2)):
        matches_cpu(lambda t: FN[mode](t, axis=axis, keepdims=True), [x], rtol=1e-12, atol=1e-12)


def test_max_min_ties_and_nan(cuda, matches_cpu):
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, 5, 4, 5]], np.float32)
    for fn in (F.max, F.min):
        for axis in (None, 0, 1):
            matches_cpu(lambda t: fn(t, axis=axis), [x])
    y = np.array([[1, np.nan, 3], [0, 2, 1]], np.float32)
    be = cuda
    for mode in ("max", "min", "sum"):
        got = Reduce(mode, 1).cuda(be, be.to_device(y)).get()
        np.testing.assert_array_equal(got, Reduce(mode, 1).cpu(y))


def test_prod_with_zeros(cuda, matches_cpu):
    # the gradient of a product through one or more zeros (the vjp's rest term)
    x = np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 1.5], [1.0, -2.0, 0.5]], np.float32)
    matches_cpu(lambda t: F.prod(t, axis=1), [x])
    matches_cpu(lambda t: F.prod(t), [x[:, 1:]])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_reduce_integer_inputs(cuda, dtype):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, (3, 4, 2)).astype(dtype)
    be = cuda
    for mode in MODES:
        for axis in (None, 1, (0, 2)):
            for keepdims in (False, True):
                # as the core runs it: the input cast, and the op chosen, by the dtype rules
                op, (dtype,) = Reduce(mode, axis, keepdims).input_dtypes([x.dtype])
                xc = x.astype(dtype)
                want = op.cpu(xc)
                got = op.cuda(be, be.to_device(xc))
                assert got.dtype == want.dtype == dtypes.reduce_dtypes(mode, x.dtype)[1], (mode, axis)
                assert got.shape == want.shape, (mode, axis)
                np.testing.assert_allclose(got.get(), want, rtol=1e-12)


def test_device_array_methods(cuda):
    # DeviceArray.sum/mean/max/min (the core and the optimizers use these)
    be = cuda
    x = _x((3, 4), np.float64)
    d = be.to_device(x)
    np.testing.assert_allclose(d.sum().get(), x.sum(), rtol=1e-12)
    np.testing.assert_allclose(d.sum(axis=(0,), keepdims=True).get(), x.sum(0, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(d.mean(axis=1).get(), x.mean(1), rtol=1e-12)
    np.testing.assert_allclose(d.max(axis=0).get(), x.max(0))
    np.testing.assert_allclose(d.min().get(), x.min())
    assert d.sum(dtype=np.float32).dtype == np.float32
    r = d.sum(axis=())                      # nothing reduced: a copy, not the same memory
    assert r.ptr != d.ptr and np.array_equal(r.get(), x)


@pytest.mark.parametrize("mean", [False, True])
def test_broadcast_back(cuda, matches_cpu, mean):
    be = cuda
    rng = np.random.default_rng(2)
    ref = np.zeros((2, 3, 4), np.float32)
    for axis, keepdims in ((None, False), (None, True), ((1,), False), ((0, 2), False), ((0, 2), True),
                           ((-1,), True), ((), False)):
        op = BroadcastBack(axis, keepdims, mean)
        g = rng.standard_normal(Reduce("sum", axis, keepdims).infer(gc.op.TensorDesc(ref.shape))[0].shape)
        for dtype in (np.float32, np.float64):
            gd = g.astype(dtype)
            got = op.cuda(be, be.to_device(gd), be.shape_only(ref.shape, ref.dtype))
            want = op.cpu(gd, ref)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got.get(), want, rtol=1e-6)
        # second order of a reduction: the gradient of BroadcastBack is a Reduce
        matches_cpu(lambda t, r: gc.core.apply(op, t, r)[0] * r, [g.astype(np.float32), _x(ref.shape)])
    # 0-d and empty references
    for shape, axis in (((), None), ((0, 3), (0,)), ((0, 3), (1,))):
        op = BroadcastBack(axis, False, mean)
        gshape = Reduce("sum", axis).infer(gc.op.TensorDesc(shape))[0].shape
        g = np.ones(gshape, np.float32)
        got = op.cuda(be, be.to_device(g), be.shape_only(shape, np.float32))
        np.testing.assert_array_equal(got.get(), op.cpu(g, np.zeros(shape, np.float32)))


@pytest.mark.parametrize("mode", ["argmax", "argmin"])
def test_arg_reduce(cuda, matches_cpu, mode):
    fn = F.argmax if mode == "argmax" else F.argmin
    x = _x((3, 4, 5))
    for axis in (None, 0, 1, -1):
        for keepdims in (False, True):
            # the index is not differentiable: only the forward compares
            matches_cpu(lambda t: fn(t, axis=axis, keepdims=keepdims), [x])
    ties = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [np.nan, 5, np.nan, 5], [1, np.nan, 7, -7]], np.float32)
    be = cuda
    for dtype, arr in ((np.float32, ties), (np.float64, ties), (np.int32, np.arange(12).reshape(3, 4) % 5),
                       (np.int64, np.arange(12).reshape(3, 4) % 4), (np.bool_, np.eye(3, 4))):
        arr = arr.astype(dtype)
        for axis in (None, 0, 1):
            op = ArgReduce(mode, axis)
            got = op.cuda(be, be.to_device(arr))
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got.get(), op.cpu(arr), err_msg=f"{dtype} axis {axis}")
    # 0-d and size-1
    for arr, axis in ((np.asarray(2.0, np.float32), None), (np.ones((1,), np.float32), 0),
                      (np.ones((1, 3), np.float32), 0)):
        op = ArgReduce(mode, axis)
        np.testing.assert_array_equal(op.cuda(be, be.to_device(arr)).get(), op.cpu(arr))
    # an empty output along a kept axis; an empty reduced axis raises like the cpu
    arr = np.zeros((0, 3), np.float32)
    op = ArgReduce(mode, 1)
    assert op.cuda(be, be.to_device(arr)).get().shape == (0,)
    with pytest.raises(OpError, match="empty"):
        fn(gc.Tensor(arr, device="cuda"), axis=0)


def test_argmax_inside_graph(cuda, matches_cpu):
    # an index used to select: gradients flow through the values only
    x = _x((3, 4))
    matches_cpu(lambda t: F.max(t, axis=1) * F.astype(F.argmax(t, axis=1), "float32"), [x])


def test_cumsum(cuda, matches_cpu):
    x = _x((3, 4, 2))
    for axis in (0, 1, 2, -1):
        matches_cpu(lambda t: F.cumsum(t, axis=axis), [x])
        matches_cpu(lambda t: F.cumsum(t, axis=axis) * t, [x])           # second order not zero
    matches_cpu(lambda t: F.cumsum(t * t, axis=0), [x.astype(np.float64)], rtol=1e-12, atol=1e-12)
    matches_cpu(lambda t: F.cumsum(t, axis=0), [np.asarray(1.5, np.float32)])     # 0-d
    matches_cpu(lambda t: F.cumsum(t, axis=0), [_x((1,))])
    matches_cpu(lambda t: F.cumsum(t, axis=1), [np.zeros((2, 0), np.float32)])
    matches_cpu(lambda t: F.cumsum(t, axis=1), [np.zeros((0, 3), np.float32)])
    be = cuda
    for rev in (False, True):
        for dtype in (np.int32, np.int64, np.bool_, np.uint8, np.float64):
            arr = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
            for axis in (0, 1):
                op = CumSum(axis, rev)
                got = op.cuda(be, be.to_device(arr))
                want = op.cpu(arr)
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got.get(), want)
