"""matmul: 2-D, batched, broadcast batch axes, 1-D operands and every
transpose_a / transpose_b combination; values and gradients against PyTorch,
first and second order gradients against finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F

# (shape of a, shape of b) as multiplied, before any transposition
SHAPES = [
    ((3, 4), (4, 2)),
    ((2, 3, 4), (2, 4, 5)),          # batched
    ((5, 3, 4), (4, 2)),             # b broadcast over a's batch
    ((3, 4), (2, 4, 2)),             # a broadcast over b's batch
    ((2, 1, 3, 4), (3, 4, 2)),       # both batch axes broadcast
    ((1, 4), (4, 1)),
    ((4,), (4, 2)),                  # 1-D operands
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((4,), (2, 4, 3)),
]
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]


def _stored(shape, transposed):
    """The shape the operand is stored in when it is passed transposed."""
    if transposed and len(shape) >= 2:
        return shape[:-2] + (shape[-1], shape[-2])
    return shape


CASES = [pytest.param(sa, sb, ta, tb, id=f"{list(sa)}@{list(sb)}-ta{int(ta)}-tb{int(tb)}".replace(" ", ""))
         for sa, sb in SHAPES for ta, tb in TRANSPOSES
         if not ((ta and len(sa) == 1) or (tb and len(sb) == 1))]
CASES += [pytest.param((4,), (4, 2), True, True, id="1-D-ignores-transpose")]


def operands(sa, sb, ta, tb, rng, dtype=np.float64):
    a = rng.standard_normal(_stored(sa, ta)).astype(dtype)
    b = rng.standard_normal(_stored(sb, tb)).astype(dtype)
    return a, b


def gc_mm(ta, tb):
    return lambda a, b: F.matmul(a, b, transpose_a=ta, transpose_b=tb)


def torch_mm(torch, ta, tb):
    def fn(a, b):
        if ta and a.ndim >= 2:
            a = a.transpose(-1, -2)
        if tb and b.ndim >= 2:
            b = b.transpose(-1, -2)
        return torch.matmul(a, b)
    return fn


def numpy_mm(a, b, ta, tb):
    if ta and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    if tb and b.ndim >= 2:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


@pytest.mark.parametrize("sa, sb, ta, tb", CASES)
def test_values(sa, sb, ta, tb, rng):
    a, b = operands(sa, sb, ta, tb, rng)
    out = gc_mm(ta, tb)(gradcore.Tensor(a), gradcore.Tensor(b))
    ref = numpy_mm(a, b, ta, tb)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sa, sb, ta, tb", CASES)
def test_gradcheck(sa, sb, ta, tb, rng, h):
    h.check_grads(gc_mm(ta, tb), list(operands(sa, sb, ta, tb, rng)), second=False)


@pytest.mark.parametrize("sa, sb, ta, tb", CASES)
def test_gradgradcheck(sa, sb, ta, tb, rng):
    from gradcore.testing import gradgradcheck
    a, b = operands(sa, sb, ta, tb, rng)
    mm = gc_mm(ta, tb)
    # the product with itself squared: d2/da2 is non-zero too
    assert gradgradcheck(lambda a, b: mm(a, b) * mm(a, b), [gradcore.Tensor(a), gradcore.Tensor(b)])


@pytest.mark.parametrize("sa, sb, ta, tb", CASES)
def test_vs_torch(sa, sb, ta, tb, rng, h, torch):
    h.compare(torch, gc_mm(ta, tb), torch_mm(torch, ta, tb), list(operands(sa, sb, ta, tb, rng)),
              rtol=1e-10, atol=1e-12)


def test_operator_and_linear_spelling(rng, h, torch):
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    h.compare(torch, lambda x, y: x @ y, lambda x, y: x @ y, [a, b])


def test_only_one_operand_recorded(rng):
    a = gradcore.Tensor(rng.standard_normal((3, 4)))
    b = gradcore.Tensor(rng.standard_normal((5, 4, 2)))
    gm = gradcore.GradManager().attach([b])
    with gm:
        y = F.matmul(a, b)
        gm.backward(y, gradcore.Tensor(np.ones(y.shape)))
    np.testing.assert_allclose(b.grad.numpy(), np.broadcast_to(a.numpy().sum(0)[:, None], (5, 4, 2)))
    assert a.grad is None


def test_dot(rng, h, torch):
    a, b = rng.standard_normal(4), rng.standard_normal(4)
    h.compare(torch, F.dot, torch.dot, [a, b])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_dtype(dtype, ta, tb, rng, h):
    a, b = operands((2, 3, 4), (4, 2), ta, tb, rng, dtype)
    out, grads, _ = h.gc_vjp(gc_mm(ta, tb), [a, b])
    assert out.dtype == np.dtype(dtype)
    assert [g.dtype for g in grads] == [np.dtype(dtype)] * 2
    assert grads[0].shape == a.shape and grads[1].shape == b.shape
    np.testing.assert_allclose(out, numpy_mm(a.astype(np.float64), b.astype(np.float64), ta, tb),
                               rtol=1e-5, atol=1e-5)


# ---- bad input
@pytest.mark.parametrize("sa, sb, ta, tb", [
    ((2, 3), (4, 5), False, False),
    ((2, 3), (2, 5), False, False),
    ((3, 2), (4, 5), True, False),
    ((2, 3), (5, 4), False, True),
])
def test_inner_dimension_mismatch(sa, sb, ta, tb, h):
    a, b = gradcore.Tensor(np.ones(sa)), gradcore.Tensor(np.ones(sb))
    with pytest.raises(ValueError) as ei:
        F.matmul(a, b, transpose_a=ta, transpose_b=tb)
    h.check_error(ei, "MatrixMul", str(sa), str(sb))


def test_batch_mismatch(h):
    a, b = gradcore.Tensor(np.ones((2, 3, 4))), gradcore.Tensor(np.ones((3, 4, 5)))
    with pytest.raises(ValueError) as ei:
        F.matmul(a, b)
    h.check_error(ei, "MatrixMul", "(2, 3, 4)", "(3, 4, 5)")


def test_mismatch_while_recording(h):
    a, b = gradcore.Tensor(np.ones((2, 3))), gradcore.Tensor(np.ones((4, 5)))
    gm = gradcore.GradManager().attach([a])
    with gm:
        with pytest.raises(ValueError) as ei:
            a @ b
    h.check_error(ei, "MatrixMul", "(2, 3)", "(4, 5)")
