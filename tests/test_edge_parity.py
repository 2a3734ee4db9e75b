"""Values and gradients at the edges PyTorch handles (found by a parity
sweep): second order of smooth_l1 where input equals target, a zero vector
in cosine_similarity, nll_loss with every target ignored, relu6 / hsigmoid /
hswish at -inf, atan2 of two infinities, logaddexp with an infinite input,
binary cross entropy of probabilities exactly 0 and 1."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager

INF = np.inf


def _value_and_grad(fn, *arrays):
    xs = [gc.tensor(a) for a in arrays]
    gm = GradManager().attach(xs)
    with gm:
        y = fn(*xs)
        gm.backward(y.sum())
    return y.numpy(), [x.grad.numpy() for x in xs]


def _torch_value_and_grad(torch, fn, *arrays):
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = fn(*xs)
    y.sum().backward()
    return y.detach().numpy(), [x.grad.numpy() for x in xs]


def test_smooth_l1_second_order_where_input_equals_target(torch):
    x0, t0 = np.array([0.0, 0.3, 2.0]), np.array([0.0, 0.1, 0.0])
    for beta in (1.0, 0.5):
        x = gc.tensor(x0)
        outer, inner = GradManager().attach([x]), GradManager().attach([x])
        with outer:
            with inner:
                loss = F.nn.smooth_l1_loss(x, gc.tensor(t0), reduction="sum", beta=beta)
                inner.backward(loss)
            g = x.grad
            x.grad = None
            outer.backward(g.sum())
        tx = torch.tensor(x0, requires_grad=True)
        (tg,) = torch.autograd.grad(torch.nn.functional.smooth_l1_loss(tx, torch.tensor(t0), reduction="sum",
                                                                         beta=beta), tx, create_graph=True)
        (tgg,) = torch.autograd.grad(tg.sum(), tx)
        np.testing.assert_allclose(x.grad.numpy(), tgg.numpy(), atol=1e-12)
        assert x.grad.numpy()[0] == 1 / beta


def test_cosine_similarity_of_a_zero_vector_has_finite_gradients(torch):
    a, b = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]]), np.array([[1.0, 2.0, 3.0], [0.5, 0.5, 1.0]])
    got = _value_and_grad(lambda p, q: F.nn.cosine_similarity(p, q, axis=1), a, b)
    want = _torch_value_and_grad(torch, lambda p, q: torch.nn.functional.cosine_similarity(p, q, dim=1), a, b)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_nll_loss_with_every_target_ignored_is_nan_with_zero_gradients(torch):
    logp = np.log(np.full((2, 3), 1 / 3))
    value, (grad,) = _value_and_grad(lambda x: F.nn.nll_loss(x, gc.tensor([-100, -100])), logp)
    assert np.isnan(value) and not grad.any() and not np.isnan(grad).any()
    value, (grad,) = _value_and_grad(lambda x: F.nn.nll_loss(x, gc.tensor([2, -100])), logp)
    assert value == pytest.approx(np.log(3)) and grad.tolist() == [[0, 0, -1], [0, 0, 0]]


@pytest.mark.parametrize("name, torch_name", [("relu6", "relu6"), ("hsigmoid", "hardsigmoid"),
                                              ("hswish", "hardswish")])
def test_hard_activations_at_infinities(name, torch_name, torch):
    x = np.array([-INF, -4.0, -3.0, 0.0, 2.0, 7.0, INF])
    value, (grad,) = _value_and_grad(getattr(F, name), x)
    tv, (tg,) = _torch_value_and_grad(torch, getattr(torch.nn.functional, torch_name), x)
    finite = ~np.isnan(tv)       # (torch's hardswish(-inf) is NaN; gradcore's 0, its limit)
    np.testing.assert_allclose(value[finite], tv[finite])
    assert value[0] == 0 and not np.isnan(grad).any()
    np.testing.assert_allclose(grad[1:], tg[1:])


def test_atan2_of_two_infinities_and_logaddexp_of_an_infinity(torch):
    y = np.array([INF, INF, -INF, -INF, 1.0])
    x = np.array([INF, -INF, INF, -INF, INF])
    np.testing.assert_allclose(F.atan2(gc.tensor(y), gc.tensor(x)).numpy(), np.arctan2(y, x), rtol=1e-15)
    a, b = np.array([INF, 2.0, -INF, INF, 1.0]), np.array([2.0, INF, 3.0, INF, 1.0])
    got = _value_and_grad(F.logaddexp, a, b)
    want = _torch_value_and_grad(torch, torch.logaddexp, a, b)
    np.testing.assert_allclose(got[0], want[0])
    for g, w in zip(got[1][:1], want[1][:1]):
        np.testing.assert_allclose(g[:3], w[:3])      # (torch's gradient at (inf, inf) is NaN)


def test_atan2_counts_the_sign_of_zero_and_its_gradient_at_the_origin_is_zero(torch):
    # atan2(0, -0.0) is pi, atan2(-0.0, -1) is -pi, as C, NumPy and torch; the
    # composed form this replaced took -0.0 for +0.0 there
    y = np.array([0.0, -0.0, -0.0, 0.0, -0.0, 0.0, 2.0])
    x = np.array([-0.0, -0.0, -1.0, 0.0, 0.0, -3.0, -0.0])
    got = _value_and_grad(F.atan2, y, x)
    want = _torch_value_and_grad(torch, torch.atan2, y, x)
    np.testing.assert_array_equal(np.signbit(got[0]), np.signbit(np.arctan2(y, x)))
    np.testing.assert_allclose(got[0], np.arctan2(y, x), rtol=1e-15)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-15)


def test_binary_cross_entropy_of_probabilities_0_and_1_is_finite(torch):
    p, t = np.array([0.0, 1.0, 0.5]), np.array([1.0, 0.0, 0.5])
    value, (grad,) = _value_and_grad(lambda q: F.nn.binary_cross_entropy(q, gc.tensor(t), with_logits=False), p)
    tv = torch.nn.functional.binary_cross_entropy(torch.tensor(p), torch.tensor(t))
    assert value == pytest.approx(tv.item(), rel=1e-12) and np.isfinite(grad).all()
