"""Reductions sum/mean/max/min/prod over every kind of axis argument:
values against NumPy and PyTorch, gradients against finite differences
(first and second order) and PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore.core import apply
from gradcore.ops import Reduce

MODES = ["sum", "mean", "max", "min", "prod"]

# (input shape, axis)
AXES = [
    ((), None),
    ((), 0),
    ((), -1),
    ((1,), 0),
    ((4,), None),
    ((4,), -1),
    ((2, 3), None),
    ((2, 3), 0),
    ((2, 3), -1),
    ((2, 3), (0, 1)),
    ((2, 1, 3), 1),            # a size-1 axis
    ((2, 1, 3), (0, -1)),
    ((2, 3, 2), (-3, 1)),
    ((2, 3, 2), (2,)),
]

CASES = [pytest.param(mode, shape, axis, keepdims,
                      id=f"{mode}-{list(shape)}-ax{axis}-{'keep' if keepdims else 'drop'}".replace(" ", ""))
         for mode in MODES for shape, axis in AXES for keepdims in (False, True)]


def sample(mode, shape, rng, dtype=np.float64):
    n = int(np.prod(shape, dtype=np.int64))
    if mode in ("max", "min"):
        # distinct values 0.3 apart: no ties, finite differences cannot swap the winner
        vals = rng.permutation(n) * 0.3 - 0.15 * n + rng.uniform(-0.05, 0.05, n)
    elif mode == "prod":
        vals = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
    else:
        vals = rng.uniform(-2, 2, n)
    return np.asarray(vals.reshape(shape), dtype=dtype)


def np_axis(axis):
    return tuple(axis) if isinstance(axis, tuple) else axis


def numpy_ref(mode, x, axis, keepdims):
    if x.ndim == 0:
        return x.copy()          # any axis of a scalar: the scalar itself
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[mode]
    return np.asarray(fn(x, axis=np_axis(axis), keepdims=keepdims))


def gc_reduce(mode, axis, keepdims):
    return lambda x: apply(Reduce(mode, axis, keepdims), x)[0]


def torch_reduce(torch, mode, axis, keepdims):
    def fn(x):
        nd = max(x.ndim, 1)         # torch accepts dim 0 / -1 on a 0-d tensor
        dims = tuple(range(nd)) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
        if mode in ("sum", "mean"):
            return getattr(torch, mode)(x, dim=dims, keepdim=keepdims)
        if mode in ("max", "min"):
            return getattr(torch, "a" + mode)(x, dim=dims, keepdim=keepdims)
        for d in sorted((d % nd for d in dims), reverse=True):   # prod: one dim at a time
            x = torch.prod(x, dim=d, keepdim=keepdims)
        return x
    return fn


@pytest.mark.parametrize("mode, shape, axis, keepdims", CASES)
def test_values(mode, shape, axis, keepdims, rng):
    x = sample(mode, shape, rng)
    out = gc_reduce(mode, axis, keepdims)(gradcore.Tensor(x))
    ref = numpy_ref(mode, x, axis, keepdims)
    assert out.shape == ref.shape
    assert out.dtype == x.dtype
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)


@pytest.mark.parametrize("mode, shape, axis, keepdims", CASES)
def test_gradcheck(mode, shape, axis, keepdims, rng, h):
    x = sample(mode, shape, rng)
    h.check_grads(gc_reduce(mode, axis, keepdims), [x], second=False)


@pytest.mark.parametrize("mode, shape, axis, keepdims", CASES)
def test_gradgradcheck(mode, shape, axis, keepdims, rng, h):
    # sin() makes the second derivative non-trivial for the linear reductions
    x = sample(mode, shape, rng)
    red = gc_reduce(mode, axis, keepdims)
    from gradcore.testing import gradgradcheck
    assert gradgradcheck(lambda t: F.sin(red(t)) * red(t), [gradcore.Tensor(x)])


@pytest.mark.parametrize("mode, shape, axis, keepdims", CASES)
def test_vs_torch(mode, shape, axis, keepdims, rng, h, torch):
    x = sample(mode, shape, rng)
    h.compare(torch, gc_reduce(mode, axis, keepdims), torch_reduce(torch, mode, axis, keepdims),
              [x], rtol=1e-10, atol=1e-12)


# ---- ties and zeros: the subgradients PyTorch uses
@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize("axis", [None, 1])
def test_ties_share_gradient(mode, axis, h):
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    if mode == "min":
        x = -x
    _, grads, w = h.gc_vjp(gc_reduce(mode, axis, False), [x])
    if axis is None:
        # the two 3s share it (torch's max() without dim does the same)
        expected = np.array([[0, 0.5, 0.5], [0, 0, 0]]) * w
    else:
        expected = np.array([[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]]) * w[:, None]
    h.assert_close(grads[0], expected)


def test_max_tie_like_torch_amax(h, torch):
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    h.compare(torch, gc_reduce("max", 1, True), lambda t: torch.amax(t, dim=1, keepdim=True), [x])


@pytest.mark.parametrize("x", [
    [[1.5, 0.0, 2.0], [3.0, -1.0, 0.5]],     # one zero in a row
    [[0.0, 0.0, 2.0], [3.0, -1.0, 0.5]],     # two zeros in a row
], ids=["one-zero", "two-zeros"])
@pytest.mark.parametrize("axis", [None, 1])
def test_prod_with_zeros_like_torch(x, axis, h, torch):
    x = np.array(x)
    tfn = (lambda t: torch.prod(t)) if axis is None else (lambda t: torch.prod(t, dim=axis))
    h.compare(torch, gc_reduce("prod", axis, False), tfn, [x])


@pytest.mark.parametrize("x", [
    [[1.5, 0.0, 2.0, -0.5], [3.0, -1.0, 0.5, 2.0]],
    [[1.5, 0.0, 2.0, 0.0], [3.0, -1.0, 0.0, 2.0]],
    [[0.0, 0.0, 0.0, 1.5], [0.0, -1.0, 0.5, 2.0]],
], ids=["one-zero", "two-zeros", "three-zeros"])
@pytest.mark.parametrize("axis", [None, 1])
def test_prod_with_zeros_gradcheck(x, axis, h):
    h.check_grads(gc_reduce("prod", axis, False), [np.array(x)])


# ---- methods and functional spellings reach the same op
def test_functional_and_methods(h, torch):
    x = np.arange(6.0).reshape(2, 3) / 7 + 0.1
    for name in MODES:
        h.compare(torch, lambda t: getattr(F, name)(t, axis=-1, keepdims=True),
                  torch_reduce(torch, name, -1, True), [x])
        h.compare(torch, lambda t: getattr(t, name)(0), torch_reduce(torch, name, 0, False), [x])


# ---- dtypes
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype(mode, dtype, rng, h):
    x = sample(mode, (2, 3), rng, dtype)
    out, grads, _ = h.gc_vjp(gc_reduce(mode, 1, False), [x])
    assert out.dtype == np.dtype(dtype) and grads[0].dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, numpy_ref(mode, x.astype(np.float64), 1, False), rtol=1e-5)


def test_int_mean_is_float():
    out = F.mean(gradcore.Tensor(np.array([1, 2], np.int32)))
    assert out.dtype.kind == "f" and out.item() == 1.5


# ---- bad input
@pytest.mark.parametrize("axis", [2, -3, (0, 5)])
def test_bad_axis(axis, h):
    x = gradcore.Tensor(np.ones((2, 3)))
    with pytest.raises(ValueError) as ei:
        F.sum(x, axis=axis)
    h.check_error(ei, "Reduce", "(2, 3)", "out of range")


def test_max_of_empty(h):
    with pytest.raises(ValueError) as ei:
        F.max(gradcore.Tensor(np.ones((0, 3))), axis=0)
    h.check_error(ei, "Reduce", "(0, 3)")


def test_gradcheck_rejects_nan_gradients():
    """The 0/0 of the old prod VJP was invisible to gradcheck: NaN must fail."""
    from gradcore.core import Op
    from gradcore.testing import gradcheck

    class NanGrad(Op):
        name = "NanGrad"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * 2

        def vjp(self, inputs, outputs, grads):
            return [grads[0] * float("nan")]

    with pytest.raises(AssertionError):
        gradcheck(lambda x: apply(NanGrad(), x)[0], [np.ones(3)])


def test_full_sum_and_mean_of_small_arrays_are_numpys_bits():
    """A full sum or mean of a small contiguous float array runs compiled
    (gradcore.cpu._reduce): the same bits as NumPy's, whatever the size (the
    eight-sum blocks, their remainders and the halving of long runs), with
    inf, NaN and signed zeros; anything else is NumPy's own call."""
    from gradcore.cpu._reduce import full_mean, full_sum
    rng = np.random.default_rng(7)
    for n in list(range(1, 140)) + [255, 256, 257, 1000, 4096, 4097]:
        for dtype in (np.float32, np.float64):
            a = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)).astype(dtype)
            if n % 5 == 0:
                a[rng.integers(n)] = [np.inf, -np.inf, np.nan, -0.0, 0.0][n % 25 // 5]
            for got, want in ((full_sum(a), np.add.reduce(a, axis=None)), (full_mean(a), np.mean(a))):
                assert got.dtype == want.dtype and got.shape == ()
                assert got.tobytes() == np.asarray(want).tobytes(), (n, dtype, got, want)
    assert full_sum(np.array([-0.0, -0.0], np.float32)).tobytes() == np.float32(0.0).tobytes()
    # not small, contiguous, native floats: NumPy's call, same answers
    others = [np.arange(10), np.ones((4, 6), np.float32)[:, ::2], np.ones(3, np.float16),
              np.ones(3, ">f4"), np.zeros(0, np.float32)]
    for a in others:
        assert np.array_equal(full_sum(a), np.add.reduce(a, axis=None))
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        assert np.isnan(full_mean(np.zeros(0, np.float32)))


def test_full_reductions_use_the_compiled_kernels_and_their_backward_too():
    """F.sum / F.mean of a whole tensor and the full sum's backward call
    compiled kernels directly (no Python frame per call: the loss's fixed cost)."""
    from gradcore import _core
    from gradcore.cpu import _reduce
    from gradcore.ops.reduce import BroadcastBack, Reduce
    assert Reduce("sum").cpu is _reduce.full_sum and Reduce("mean").cpu is _reduce.full_mean
    assert BroadcastBack(None, False).cpu is _core.broadcast_like
    x = gradcore.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert F.sum(x).numpy().tobytes() == np.float32(15).tobytes()
    assert F.mean(x).numpy().tobytes() == np.float32(2.5).tobytes()
