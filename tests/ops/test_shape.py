"""Shape ops: reshape, transpose, broadcast_to, expand_dims, squeeze,
flatten, concat. Values against NumPy, gradients against finite differences
(first and second order: the ops are linear, so the second order check
squares their output, which differentiates the backward's own ops) and
against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore.testing import gradgradcheck


def _np_expand(x, axis):
    return np.expand_dims(x, axis)


# name -> list of (input shapes, gradcore fn, numpy fn, torch fn(torch) -> fn)
def _reshape(shape):
    return (lambda x: F.reshape(x, shape), lambda x: np.reshape(x, shape),
            lambda torch: (lambda x: torch.reshape(x, shape)))


def _transpose(perm):
    return (lambda x: F.transpose(x, perm), lambda x: np.transpose(x, perm),
            lambda torch: (lambda x: torch.permute(x, tuple(perm if perm is not None else range(x.ndim)[::-1]))))


def _broadcast(shape):
    return (lambda x: F.broadcast_to(x, shape), lambda x: np.broadcast_to(x, shape),
            lambda torch: (lambda x: torch.broadcast_to(x, shape)))


def _via_reshape(np_fn):
    """A torch reference for an op that only changes the shape: reshape to
    the shape NumPy gives."""
    return lambda torch: (lambda x: torch.reshape(x, np_fn(np.zeros(tuple(x.shape))).shape))


def _expand(axis):
    np_fn = lambda x: np.expand_dims(x, axis)
    return lambda x: F.expand_dims(x, axis), np_fn, _via_reshape(np_fn)


def _squeeze(axis):
    np_fn = lambda x: np.squeeze(x, axis)
    return lambda x: F.squeeze(x, axis), np_fn, _via_reshape(np_fn)


def _flatten(start, end):
    def np_fn(x):
        if x.ndim == 0:
            return x.reshape(1)
        s, e = start % x.ndim, end % x.ndim
        return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])
    return (lambda x: F.flatten(x, start, end), np_fn,
            lambda torch: (lambda x: torch.flatten(x, start, end) if x.ndim else x.reshape(1)))


def _concat(axis):
    return (lambda *xs: F.concat(xs, axis), lambda *xs: np.concatenate(xs, axis),
            lambda torch: (lambda *xs: torch.cat(xs, axis)))


CASES = {
    "reshape": [
        ([(2, 3)], _reshape((3, 2))),
        ([(2, 3)], _reshape((-1,))),
        ([(2, 3)], _reshape((3, -1))),
        ([(2, 3, 2)], _reshape((2, -1))),
        ([(6,)], _reshape((2, 1, 3))),
        ([()], _reshape((1, 1))),
        ([(1,)], _reshape(())),
        ([(1, 1)], _reshape((-1,))),
    ],
    "transpose": [
        ([(2, 3)], _transpose(None)),
        ([(2, 3, 4)], _transpose((1, 2, 0))),
        ([(2, 3, 4)], _transpose((2, 0, 1))),
        ([(1, 3)], _transpose((1, 0))),
        ([()], _transpose(())),
    ],
    "broadcast_to": [
        ([()], _broadcast((2, 3))),
        ([(1,)], _broadcast((3,))),
        ([(3, 1)], _broadcast((2, 3, 4))),
        ([(2, 1, 3)], _broadcast((2, 4, 3))),
        ([(2, 3)], _broadcast((2, 3))),
    ],
    "expand_dims": [
        ([(2, 3)], _expand(0)),
        ([(2, 3)], _expand(-1)),
        ([(2, 3)], _expand((0, 2))),
        ([(3,)], _expand((0, -1))),
        ([()], _expand(0)),
    ],
    "squeeze": [
        ([(1, 3, 1)], _squeeze(None)),
        ([(1, 3, 1)], _squeeze(0)),
        ([(1, 3, 1)], _squeeze(-1)),
        ([(1, 3, 1)], _squeeze((0, 2))),
        ([(1,)], _squeeze(0)),
        ([(1, 1)], _squeeze(None)),
    ],
    "flatten": [
        ([(2, 3, 2)], _flatten(0, -1)),
        ([(2, 3, 2)], _flatten(1, -1)),
        ([(2, 3, 2)], _flatten(0, 1)),
        ([(3,)], _flatten(0, -1)),
        ([()], _flatten(0, -1)),
    ],
    "concat": [
        ([(2, 3), (1, 3)], _concat(0)),
        ([(2, 3), (2, 1), (2, 2)], _concat(1)),
        ([(2, 3), (2, 3)], _concat(-1)),
        ([(3,)], _concat(0)),
        ([(2, 2, 1), (2, 2, 3)], _concat(-1)),
    ],
}

PARAMS = [pytest.param(shapes, *fns, id=f"{name}-{k}")
          for name, cases in CASES.items() for k, (shapes, fns) in enumerate(cases)]


def arrays_for(shapes, rng, dtype=np.float64):
    return [np.asarray(rng.standard_normal(s), dtype=dtype) for s in shapes]


@pytest.mark.parametrize("shapes, gfn, nfn, tfn", PARAMS)
def test_values(shapes, gfn, nfn, tfn, rng):
    xs = arrays_for(shapes, rng)
    out = gfn(*[gradcore.Tensor(x) for x in xs])
    ref = nfn(*xs)
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out.numpy(), ref)


@pytest.mark.parametrize("shapes, gfn, nfn, tfn", PARAMS)
def test_gradcheck(shapes, gfn, nfn, tfn, rng, h):
    h.check_grads(gfn, arrays_for(shapes, rng), second=False)


@pytest.mark.parametrize("shapes, gfn, nfn, tfn", PARAMS)
def test_gradgradcheck(shapes, gfn, nfn, tfn, rng):
    xs = [gradcore.Tensor(x) for x in arrays_for(shapes, rng)]
    assert gradgradcheck(lambda *ts: gfn(*ts) * gfn(*ts), xs)


@pytest.mark.parametrize("shapes, gfn, nfn, tfn", PARAMS)
def test_vs_torch(shapes, gfn, nfn, tfn, rng, h, torch):
    h.compare(torch, gfn, tfn(torch), arrays_for(shapes, rng))


@pytest.mark.parametrize("shapes, gfn, nfn, tfn", PARAMS)
def test_float32(shapes, gfn, nfn, tfn, rng, h):
    xs = arrays_for(shapes, rng, np.float32)
    out, grads, _ = h.gc_vjp(gfn, xs)
    assert out.dtype == np.float32
    assert all(g.dtype == np.float32 and g.shape == x.shape for g, x in zip(grads, xs))


def test_tensor_methods(rng, h, torch):
    x = rng.standard_normal((2, 3, 2))
    h.compare(torch, lambda t: t.reshape(-1, 2), lambda t: t.reshape(-1, 2), [x])
    h.compare(torch, lambda t: t.reshape((3, 4)), lambda t: t.reshape(3, 4), [x])
    h.compare(torch, lambda t: t.transpose(2, 0, 1), lambda t: t.permute(2, 0, 1), [x])
    h.compare(torch, lambda t: t.T, lambda t: t.permute(2, 1, 0), [x])
    h.compare(torch, lambda t: t.flatten(1), lambda t: t.flatten(1), [x])
    h.compare(torch, lambda t: t[:, :1].squeeze(1), lambda t: t[:, :1].squeeze(1), [x])


def test_tensor_method_shape_forms(rng, h, torch):
    # MegEngine's reshape/transpose take varargs, a tuple or list, an
    # ndarray or a Tensor; negative transpose axes count from the end (as in
    # NumPy and torch.permute), in the backward too
    x = rng.standard_normal((2, 3, 4))
    for shape in [(4, 6), [4, 6], np.array([4, 6]), gradcore.Tensor([4, 6]), (gradcore.Tensor(4), 6)]:
        assert gradcore.Tensor(x).reshape(*(shape if isinstance(shape, tuple) else (shape,))).shape == (4, 6)
    assert gradcore.Tensor(x).transpose(np.array([2, 0, 1])).shape == (4, 2, 3)
    h.compare(torch, lambda t: t.transpose(-1, 0, -2), lambda t: t.permute(-1, 0, -2), [x])
    h.compare(torch, lambda t: F.transpose(t, (1, -1, 0)), lambda t: t.permute(1, -1, 0), [x])
    assert gradgradcheck(lambda t: t.transpose(-1, 0, 1) * t.transpose(2, 0, 1), [gradcore.Tensor(x)])


@pytest.mark.parametrize("bad", [(2.5, 12), (2.0, 12.0)])
def test_tensor_method_float_shape_is_an_error(bad):
    x = gradcore.Tensor(np.ones((2, 12)))
    with pytest.raises(TypeError, match="integers"):
        x.reshape(*bad)
    with pytest.raises(TypeError, match="integers"):
        x.reshape(bad)
    with pytest.raises(TypeError, match="integers"):
        x.transpose(1.0, 0)


def test_concat_of_one_recorded_input(rng):
    a = gradcore.Tensor(rng.standard_normal((2, 2)))
    b = gradcore.Tensor(rng.standard_normal((1, 2)))
    gm = gradcore.GradManager().attach([b])
    with gm:
        y = F.concat([a, b, b], 0)
        gm.backward(y, gradcore.Tensor(np.arange(8.0).reshape(4, 2)))
    np.testing.assert_array_equal(b.grad.numpy(), [[4.0 + 6.0, 5.0 + 7.0]])
    assert a.grad is None


# ---- bad input
BAD = [
    (lambda x: F.reshape(x, (4,)), (2, 3), ["Reshape", "(2, 3)", "(4,)"]),
    (lambda x: F.reshape(x, (-1, 4)), (2, 3), ["Reshape", "(2, 3)"]),
    (lambda x: F.reshape(x, (-1, -1)), (2, 3), ["Reshape", "(2, 3)", "-1"]),
    # NumPy's reshape would take -2 as -1
    (lambda x: F.reshape(x, (-2, 3)), (2, 3), ["Reshape", "-2"]),
    (lambda x: x.reshape(3, -3), (2, 3), ["Reshape", "-3"]),
    (lambda x: F.transpose(x, (0, -3)), (2, 3), ["Transpose", "(2, 3)"]),
    (lambda x: F.transpose(x, (0, 0)), (2, 3), ["Transpose", "(2, 3)"]),
    (lambda x: F.transpose(x, (0, 1, 2)), (2, 3), ["Transpose", "(2, 3)"]),
    (lambda x: F.broadcast_to(x, (4, 3)), (2, 3), ["Broadcast", "(2, 3)", "(4, 3)"]),
    (lambda x: F.broadcast_to(x, (3,)), (2, 3), ["Broadcast", "(2, 3)", "(3,)"]),
    (lambda x: F.expand_dims(x, 3), (2, 3), ["ExpandDims", "(2, 3)", "axis 3"]),
    (lambda x: F.squeeze(x, 1), (2, 3), ["Squeeze", "(2, 3)", "axis 1"]),
    (lambda x: F.squeeze(x, 2), (2, 3), ["Squeeze", "(2, 3)", "axis 2"]),
    (lambda x: F.concat([x, gradcore.Tensor(np.ones((2, 2)))], 0), (2, 3),
     ["Concat", "(2, 3)", "(2, 2)"]),
    (lambda x: F.concat([x, gradcore.Tensor(np.ones(3))], 0), (2, 3), ["Concat", "(2, 3)", "(3,)"]),
    (lambda x: F.concat([x, x], 2), (2, 3), ["Concat", "(2, 3)"]),
]


@pytest.mark.parametrize("fn, shape, needles", BAD, ids=lambda v: "" if callable(v) else None)
@pytest.mark.parametrize("record", [False, True])
def test_bad_input(fn, shape, needles, record, h):
    ei = h.error_of(fn, gradcore.Tensor(np.ones(shape)), record)
    h.check_error(ei, *needles)


# ---- regression test for a core bug, fixed in gradcore/graph.py
def test_one_output_kernel_returning_a_tuple_inside_a_backward():
    from gradcore.core import Op, apply

    class Twice(Op):
        name = "Twice"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return (x * 2,)

        def vjp(self, inputs, outputs, grads):
            return [grads[0] * 2]

    class Sixfold(Op):      # its backward graph calls Twice
        name = "Sixfold"

        def infer(self, x):
            return (x,)

        def cpu(self, x):
            return x * 6

        def vjp(self, inputs, outputs, grads):
            return [apply(Twice(), grads[0])[0] * 3]

    x = gradcore.Tensor(np.ones(3))
    assert apply(Twice(), x)[0].shape == (3,)          # the forward accepts the 1-tuple
    gm = gradcore.GradManager().attach([x])
    with gm:
        gm.backward(apply(Sixfold(), x)[0], gradcore.Tensor(np.ones(3)))
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 6.0, 6.0])
