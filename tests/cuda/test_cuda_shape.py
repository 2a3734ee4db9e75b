"""The shape ops (ops/shape.py) on cuda: outputs, first- and second-order
gradients against the cpu, through the functional API where there is one,
and the backward-graph ops (the *Like ops, SumTo, Unstack, SplitLike,
ZerosLike) through the gradients that use them and directly."""
import numpy as np
import pytest
from gradcore.ops import shape as S

import gradcore as gc
import gradcore.functional as F
from gradcore import _core
from gradcore.op import OpError

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def apply1(op, *xs):
    return _core.apply(op, *xs)[0]


# ---------------------------------------------------------------- reshape family
@pytest.mark.parametrize("shape,target", [
    ((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (4, -1, 2)), ((), (1, 1)), ((1,), ()),
    ((0, 3), (3, 0)), ((0, 3), (-1, 3)), ((5,), (5, 1)),
])
def test_reshape(cuda, matches_cpu, shape, target):
    matches_cpu(lambda x: F.reshape(x * x, target), [rand(*shape)])


def test_reshape_method_float64_and_ints(cuda, matches_cpu):
    matches_cpu(lambda x: (x * x).reshape(3, 2) * 2, [rand(2, 3, dtype=np.float64)])
    matches_cpu(lambda x: x.reshape(-1), [np.arange(6, dtype=np.int32).reshape(2, 3)])


@pytest.mark.parametrize("shape,start,end", [((2, 3, 4), 0, -1), ((2, 3, 4), 1, -1), ((2, 3, 4), 0, 1),
                                             ((), 0, -1), ((2, 0, 3), 1, 2)])
def test_flatten(cuda, matches_cpu, shape, start, end):
    matches_cpu(lambda x: F.flatten(x * x, start, end), [rand(*shape)])


@pytest.mark.parametrize("shape,axis", [((2, 3), 0), ((2, 3), -1), ((2, 3), (0, 2)), ((2, 3), (-1, 1)),
                                        ((), 0), ((0, 3), 1)])
def test_expand_dims(cuda, matches_cpu, shape, axis):
    matches_cpu(lambda x: F.expand_dims(x * x, axis), [rand(*shape)])


@pytest.mark.parametrize("shape,axis", [((1, 3, 1), None), ((1, 3, 1), 0), ((1, 3, 1), -1), ((1, 3, 1), (0, 2)),
                                        ((), None), ((1,), None), ((0, 1), 1)])
def test_squeeze(cuda, matches_cpu, shape, axis):
    matches_cpu(lambda x: F.squeeze(x * x, axis), [rand(*shape)])


def test_reshape_like_with_a_reference(cuda, matches_cpu):
    # ReshapeLike's reference is read for its shape only (a shape-only array
    # in backward graphs); its own gradient is None
    matches_cpu(lambda x, r: apply1(S.ReshapeLike(), x * x, r) * r, [rand(2, 3), rand(3, 2)])


def test_reshape_is_a_view(cuda):
    x = gc.Tensor(rand(2, 3), device="cuda")
    y = F.reshape(x, (3, 2))
    assert y._data.ptr == x._data.ptr and y.shape == (3, 2)


# ---------------------------------------------------------------- transpose
@pytest.mark.parametrize("perm", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
def test_transpose_3d(cuda, matches_cpu, perm):
    matches_cpu(lambda x: F.transpose(x * x, perm), [rand(2, 3, 4)])


@pytest.mark.parametrize("shape,perm", [((1, 3, 1, 2), (3, 2, 0, 1)), ((2, 1, 3), (2, 1, 0)), ((2, 1, 3), (1, 0, 2)),
                                        ((), ()), ((1,), (0,)), ((0, 2, 3), (2, 0, 1)),
                                        ((2, 3, 2, 2), (0, 3, 1, 2)), ((2, 2, 1, 2, 2), (4, 3, 2, 1, 0))])
def test_transpose_shapes(cuda, matches_cpu, shape, perm):
    matches_cpu(lambda x: F.transpose(x * x, perm), [rand(*shape)])


def test_transpose_default_method_and_dtypes(cuda, matches_cpu):
    matches_cpu(lambda x: F.transpose(x * x), [rand(2, 3, 2, dtype=np.float64)])
    matches_cpu(lambda x: x.T * x.T, [rand(3, 4)])
    matches_cpu(lambda x: x.transpose(1, 0), [np.arange(6, dtype=np.int64).reshape(2, 3)])
    matches_cpu(lambda x: x.transpose(1, 0, 2), [rng.random((2, 3, 2)) > 0.5])


def test_transpose_8d(cuda):
    x = np.arange(256, dtype=np.float32).reshape((2,) * 8)
    perm = (7, 0, 6, 1, 5, 2, 4, 3)
    got = F.transpose(gc.Tensor(x, device="cuda"), perm).numpy()
    np.testing.assert_array_equal(got, x.transpose(perm))


def test_merge_axes():
    # the launcher's collapse of a transpose: size-1 axes dropped, runs merged
    assert S._merge_axes((2, 3, 4), (2, 0, 1)) == ((6, 4), (1, 0))
    assert S._merge_axes((2, 1, 3), (2, 1, 0)) == ((2, 3), (1, 0))
    assert S._merge_axes((2, 1, 3), (1, 0, 2)) == ((6,), (0,))
    assert S._merge_axes((), ()) == ((), ())
    assert S._merge_axes((2, 3, 2, 2), (0, 3, 1, 2)) == ((2, 6, 2), (0, 2, 1))


# ---------------------------------------------------------------- broadcast and the sums back
@pytest.mark.parametrize("shape,target", [((3, 1), (2, 3, 4)), ((), (2, 3)), ((4,), (2, 3, 4)), ((1,), (0,)),
                                          ((2, 1, 4), (2, 3, 4)), ((2, 3), (2, 3)), ((3,), (1, 3)), ((), ()),
                                          ((1, 3), (0, 3))])
def test_broadcast_to(cuda, matches_cpu, shape, target):
    matches_cpu(lambda x: F.broadcast_to(x * x, target) * 2, [rand(*shape)])


def test_broadcast_to_ints_and_bools(cuda, matches_cpu):
    matches_cpu(lambda x: F.broadcast_to(x, (2, 3)), [np.arange(3, dtype=np.int32)])
    matches_cpu(lambda x: F.broadcast_to(x, (2, 2, 3)), [rng.random((2, 1, 3)) > 0.5])


@pytest.mark.parametrize("a,b", [((3, 1), (4,)), ((2, 3, 4), ()), ((1, 4), (3, 1)), ((2, 1, 3), (5, 1)),
                                 ((0, 3), (3,))])
def test_broadcasting_binary_ops(cuda, matches_cpu, a, b):
    # their backward sums each gradient down to its input's shape (SumTo),
    # and the second order broadcasts it back (BroadcastToLike)
    matches_cpu(lambda x, y: x * y * y + x, [rand(*a), rand(*b, dtype=np.float64)])


def test_long_sums_back(cuda, matches_cpu):
    # more than _LONG_SUM elements per output: the sum goes through Reduce
    assert 1500 > S._LONG_SUM
    matches_cpu(lambda x, b: x * b * b, [rand(1500, 2), rand(2)], rtol=1e-3)
    matches_cpu(lambda x: apply1(S.SumTo(()), x * x), [rand(3, 700, dtype=np.float64)])
    matches_cpu(lambda x, r: apply1(S.SumToLike(), x, r), [rand(2, 1100, 1), rand(2, 1, 1)], wrt=[0])


@pytest.mark.parametrize("small,big", [((3, 1), (2, 3, 4)), ((), (2, 3)), ((4,), (2, 3, 4)), ((1, 4), (3, 4)),
                                       ((2, 1, 4), (2, 3, 4)), ((3,), (0, 3)), ((1, 3), (1, 3)), ((1,), (5,))])
def test_sum_to_and_broadcast_like_ops(cuda, matches_cpu, small, big):
    # the backward-graph ops themselves; ref is a real tensor here (no grad)
    matches_cpu(lambda x, r: apply1(S.SumToLike(), x * x, r), [rand(*big), rand(*small)], wrt=[0])
    matches_cpu(lambda x, r: apply1(S.BroadcastToLike(), x * x, r), [rand(*small), rand(*big)], wrt=[0])
    matches_cpu(lambda x: apply1(S.SumTo(small), x * x), [rand(*big)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_like_ops_take_shape_only_references(cuda, dtype):
    # in a backward graph the reference of a *Like op is a shape-only array
    x = (rng.standard_normal((2, 3, 4)) * 4).astype(dtype)
    small = (rng.standard_normal((3, 1)) * 4).astype(dtype)
    ref_big, ref_small = cuda.shape_only((2, 3, 4), dtype), cuda.shape_only((3, 1), dtype)
    got = S.SumToLike().cuda(cuda, cuda.to_device(x), ref_small).get()
    np.testing.assert_allclose(got, S.sum_to(x, (3, 1)), rtol=1e-5)
    got = S.BroadcastToLike().cuda(cuda, cuda.to_device(small), ref_big).get()
    np.testing.assert_array_equal(got, np.broadcast_to(small, (2, 3, 4)))
    got = S.ReshapeLike().cuda(cuda, cuda.to_device(x), cuda.shape_only((4, 6), dtype)).get()
    np.testing.assert_array_equal(got, x.reshape(4, 6))
    got = S.ZerosLike().cuda(cuda, ref_big)
    assert got.dtype == dtype and np.array_equal(got.get(), np.zeros((2, 3, 4), dtype))
    pieces = S.SplitLike(1).cuda(cuda, cuda.to_device(x), cuda.shape_only((2, 1, 4), dtype),
                                 cuda.shape_only((2, 2, 4), dtype))
    for g, r in zip(pieces, np.split(x, [1], axis=1)):
        np.testing.assert_array_equal(g.get(), r)


def test_sum_to_refuses_incompatible_shapes(cuda):
    x = cuda.to_device(rand(2, 4))
    with pytest.raises(OpError, match=r"SumTo.*does not broadcast"):
        S.SumTo((3,)).cuda(cuda, x)
    with pytest.raises(OpError, match=r"BroadcastToLike.*does not broadcast"):
        S.BroadcastToLike().cuda(cuda, x, cuda.shape_only((3, 4), np.float32))


# ---------------------------------------------------------------- zeros_like, identity, stop_gradient
@pytest.mark.parametrize("shape,dtype", [((2, 3), np.float32), ((), np.float64), ((0, 2), np.float32),
                                         ((3,), np.int64), ((2,), np.bool_)])
def test_zeros_like(cuda, matches_cpu, shape, dtype):
    matches_cpu(lambda x: apply1(S.ZerosLike(), x), [np.ones(shape, dtype)])


def test_identity_and_stop_gradient(cuda, matches_cpu):
    matches_cpu(lambda x: F.copy(x) * x + F.stop_gradient(x) * x * x, [rand(2, 3)])
    matches_cpu(lambda x: F.stop_gradient(x * x) + F.copy(x * x), [rand()])


# ---------------------------------------------------------------- concat / split / stack
@pytest.mark.parametrize("shapes,axis", [([(2, 3), (2, 1)], 1), ([(2, 3), (4, 3), (1, 3)], 0), ([(2, 3, 2), (2, 3, 1)], -1),
                                         ([(2, 3)], 0), ([(2, 0), (2, 3)], 1), ([(0, 2), (0, 2)], 1),
                                         ([(1,), (2,)], -1)])
def test_concat(cuda, matches_cpu, shapes, axis):
    matches_cpu(lambda *xs: F.concat([x * x for x in xs], axis), [rand(*s) for s in shapes])


def test_concat_mixed_dtypes(cuda, matches_cpu):
    matches_cpu(lambda a, b: F.concat([a * a, b * b], 1), [rand(2, 2), rand(2, 3, dtype=np.float64)])
    matches_cpu(lambda a, b: F.concat([a, b]), [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int64)])
    matches_cpu(lambda a, b: F.concat([a, b]) * 2, [rand(3), np.arange(2, dtype=np.int32)], wrt=[0])


@pytest.mark.parametrize("shape,sections,axis", [((6, 2), 3, 0), ((5, 2), 2, 0), ((2, 5), [1, 3], 1),
                                                 ((2, 3), [1, 1], -1), ((2, 3), 1, 1), ((3, 0), 2, 0),
                                                 ((4,), [0, 4], 0), ((2, 3, 4), 2, -1)])
def test_split(cuda, matches_cpu, shape, sections, axis):
    matches_cpu(lambda x: [p * p for p in F.split(x * x, sections, axis)], [rand(*shape)])


def test_split_some_pieces_unused(cuda, matches_cpu):
    # the pieces without a gradient get zeros in the backward (ZerosLike)
    matches_cpu(lambda x: F.split(x * x, 3, 1)[1], [rand(2, 3)])
    matches_cpu(lambda x: F.split(x * x, [1], 0)[0] * 2, [rand(3, 2, dtype=np.float64)])


@pytest.mark.parametrize("shape,n,axis", [((2, 3), 3, 0), ((2, 3), 2, 1), ((2, 3), 2, -1), ((2, 3), 1, 2),
                                          ((), 3, 0), ((), 2, -1), ((0, 2), 2, 1), ((1,), 1, 0)])
def test_stack(cuda, matches_cpu, shape, n, axis):
    # Stack's gradient is Unstack's, whose gradient is Stack's
    matches_cpu(lambda *xs: F.stack([x * x for x in xs], axis), [rand(*shape) for _ in range(n)])


def test_stack_dtypes(cuda, matches_cpu):
    # float32 and float64 inputs: one attached at a time (Stack's backward casts
    # the float32 input's gradient back to float32)
    mixed = [rand(2, 2), rand(2, 2, dtype=np.float64)]
    matches_cpu(lambda a, b: F.stack([a * a, b * b], 1), mixed, wrt=[0])
    matches_cpu(lambda a, b: F.stack([a * a, b * b], 1), mixed, wrt=[1])
    matches_cpu(lambda a, b: F.stack([a, b]), [rng.random(3) > 0.5, rng.random(3) > 0.5])
    matches_cpu(lambda a, b: F.stack([a, b], -1), [np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32)])


@pytest.mark.parametrize("shape,axis", [((3, 2), 0), ((2, 3, 2), 1), ((2, 3), -1), ((1,), 0), ((2, 0), 0)])
def test_unstack(cuda, matches_cpu, shape, axis):
    n = shape[axis]
    matches_cpu(lambda x: [p * p for p in _core.apply(S.Unstack(axis, n), x * x)], [rand(*shape)])


def test_split_like_one_and_many_pieces(cuda, matches_cpu):
    # SplitLike as a forward op (it is concat's backward): refs give the sizes
    matches_cpu(lambda x, a, b: [p * p for p in _core.apply(S.SplitLike(1), x * x, a, b)],
                [rand(2, 5), rand(2, 2), rand(2, 3)], wrt=[0])
    matches_cpu(lambda x, a: _core.apply(S.SplitLike(0), x * x, a)[0], [rand(3), rand(3)], wrt=[0])


# ---------------------------------------------------------------- casts and device copies
@pytest.mark.parametrize("src,dst", [(np.float32, np.float64), (np.float64, np.float32), (np.float32, np.int32),
                                     (np.float64, np.bool_), (np.int32, np.float32), (np.bool_, np.float64),
                                     (np.int64, np.int8)])
def test_astype(cuda, matches_cpu, src, dst):
    x = (rng.standard_normal((2, 3)) * 5).astype(src)
    matches_cpu(lambda x: F.astype(x * x, dst) if x.dtype.kind == "f" else x.astype(dst), [x])


def test_astype_shapes(cuda, matches_cpu):
    matches_cpu(lambda x: (x * x).astype(np.float64) * x.astype(np.float64), [rand()])
    matches_cpu(lambda x: (x * x).astype(np.float64), [rand(0, 3)])


def test_to_cpu_and_back(cuda, matches_cpu):
    # on cuda: a round trip through the cpu, gradients copied back (Copy)
    matches_cpu(lambda x: (F.tanh(x.to("cpu") * 2) * x.to("cpu")).to(x.device) * x, [rand(2, 3)])
    matches_cpu(lambda x: x.to("cpu").to(x.device) * x, [rand()])


def test_to_cuda_from_cpu_tensors(cuda):
    # cpu leaves, cuda compute, cpu result: the gradients land on the cpu
    a = rand(2, 3)
    outs = []
    for dev in ("cpu", "cuda"):
        x = gc.Tensor(a)
        with gc.autodiff.GradManager().attach([x]) as gm:
            y = (F.tanh(x.to(dev)) * x.to(dev)).sum().to("cpu")
            gm.backward(y)
        assert x.grad.device == "cpu" and y.device == "cpu"
        outs.append((y.numpy(), x.grad.numpy()))
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=1e-5)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-5)
    t = gc.Tensor(a, device="cuda")
    assert t.to("cuda") is t and t.to("cpu").device == "cpu"
    np.testing.assert_array_equal(t.to("cpu").numpy(), a)


# ---------------------------------------------------------------- errors
def test_mixed_devices_are_refused(cuda):
    a, b = gc.Tensor(rand(2, 3), device="cuda"), gc.Tensor(rand(2, 3))
    with pytest.raises(Exception, match=r"Concat.*different devices"):
        F.concat([a, b])
    with pytest.raises(Exception, match=r"Stack.*different devices"):
        F.stack([b, a])
    with pytest.raises(Exception, match="different devices"):
        a + b


@pytest.mark.parametrize("fn", [lambda x: F.reshape(x, (4, 2)), lambda x: F.transpose(x, (0, 0)),
                                lambda x: F.squeeze(x, 0), lambda x: F.expand_dims(x, 3),
                                lambda x: F.broadcast_to(x, (3, 3)), lambda x: F.split(x, 4, 0),
                                lambda x: F.split(x, [2, 1], 1), lambda x: F.concat([x, x[:, :1].T], 0),
                                lambda x: F.stack([x, x.T]), lambda x: F.stack([x], 3)])
def test_bad_inputs_raise_like_the_cpu(cuda, fn):
    a = rand(2, 3)
    with pytest.raises(Exception) as on_cpu:
        fn(gc.Tensor(a))
    with pytest.raises(type(on_cpu.value)) as on_cuda:
        fn(gc.Tensor(a, device="cuda"))
    assert str(on_cuda.value) == str(on_cpu.value)
