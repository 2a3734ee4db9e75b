"""Minimal programs from a differential fuzzer (random compositions of ops,
gradcore against PyTorch, values and gradients up to the third order), one
test per discrepancy it found, each failing before its fix."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager


def _gc_orders(fn, arrays, contractions):
    """Gradients of order 1..len(contractions)+1 of the scalar fn: each next
    order differentiates the sum of the last gradients times a contraction."""
    xs = [gc.tensor(a) for a in arrays]
    order = len(contractions) + 1
    gms = [GradManager().attach(xs) for _ in range(order)]
    result = []
    with contextlib.ExitStack() as stack:
        for gm in gms:
            stack.enter_context(gm)
        s = fn(*xs)
        for k in range(order):
            gms[order - 1 - k].backward(s)
            gs = [x.grad if x.grad is not None else gc.tensor(np.zeros(x.shape)) for x in xs]
            for x in xs:
                x.grad = None
            result.append([g.numpy() for g in gs])
            if k < order - 1:
                s = sum((g * gc.tensor(r)).sum() for g, r in zip(gs, contractions[k]))
    return result


def _torch_orders(torch, fn, arrays, contractions):
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    s, result = fn(*xs), []
    for k in range(len(contractions) + 1):
        gs = torch.autograd.grad(s, xs, create_graph=True, allow_unused=True, materialize_grads=True)
        result.append([g.detach().numpy() for g in gs])
        if k < len(contractions):
            s = sum((g * torch.tensor(r)).sum() for g, r in zip(gs, contractions[k]))
    return result


def test_prod_third_derivative_at_two_zeros():
    """d3 prod(x) / dx0 dx1 dx2 at x = (0, 0, 2) is 1 and d3 / dx0 dx1 dx1 is 0:
    the zero that stood in for a 1 in the product of the others kept a slope."""
    e = np.eye(3)
    orders = _gc_orders(lambda x: F.prod(x), [np.array([0.0, 0.0, 2.0])], [[e[0]], [e[1]]])
    assert orders[0][0].tolist() == [0, 0, 0]
    assert orders[1][0].tolist() == [0, 2, 0]
    assert orders[2][0].tolist() == [0, 0, 1]


@pytest.mark.parametrize("zeros", [[(1, 1)], [(1, 1), (2, 1)], [(0, 1), (2, 1), (3, 1)],
                                   [(0, 1), (1, 1), (2, 1), (4, 1)]],
                         ids=["one", "two", "three", "four"])
def test_prod_over_an_axis_with_zeros_to_the_fourth_order(zeros, torch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4))
    for z in zeros:
        x[z] = 0.0
    w = rng.standard_normal(4)
    rs = [[rng.standard_normal(x.shape)] for _ in range(3)]
    got = _gc_orders(lambda t: (F.prod(t, axis=0) * gc.tensor(w)).sum(), [x], rs)
    want = _torch_orders(torch, lambda t: (torch.prod(t, 0) * torch.tensor(w)).sum(), [x], rs)
    for k, (g, t) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g[0], t[0], rtol=1e-9, atol=1e-12, err_msg=f"order {k + 1}")


def test_logaddexp_second_and_third_order_at_ties(torch):
    """logaddexp(x, x) has the Hessian of a smooth function ([[1, -1], [-1, 1]] / 4
    at 0): max(x, y) + log1p(exp(-|x - y|)) had 0 there (its kinks cancel only in
    the first order). Broadcast ties as in the fuzzer's program."""
    rng = np.random.default_rng(3)
    x = np.array([[0.0, 1.0, -0.5, 2.0], [0.5, 0.5, 1.0, -2.0]])
    y = np.array([[0.0], [0.5]])
    w = rng.standard_normal(x.shape)
    rs = [[rng.standard_normal(x.shape), rng.standard_normal(y.shape)] for _ in range(2)]
    got = _gc_orders(lambda a, b: (F.logaddexp(a, b) * gc.tensor(w)).sum(), [x, y], rs)
    want = _torch_orders(torch, lambda a, b: (torch.logaddexp(a, b) * torch.tensor(w)).sum(), [x, y], rs)
    for k, (g, t) in enumerate(zip(got, want)):
        for gi, ti in zip(g, t):
            np.testing.assert_allclose(gi, ti, rtol=1e-9, atol=1e-12, err_msg=f"order {k + 1}")
    e = _gc_orders(lambda a, b: F.logaddexp(a, b).sum(), [np.array([0.0]), np.array([0.0])], [[[1.0], [0.0]]])
    assert [h.tolist() for h in e[1]] == [[0.25], [-0.25]]


def test_index_assignment_into_a_0d_tensor_then_its_gradients():
    """y[...] = v (or y[()] = v) on a 0-d y: the value's gradient went through
    a Subtensor that gave a NumPy scalar, which the next op could not read."""
    for index in [(Ellipsis,), ()]:
        x, v = gc.tensor(np.array(0.7)), gc.tensor(np.array(0.6))
        gm = GradManager().attach([x, v])
        with gm:
            y = F.copy(x) * 1.0
            y[index] = v
            gm.backward(F.copy(y) * 3.0)
        assert x.grad.numpy().tolist() == 0.0 and v.grad.numpy().tolist() == 3.0
    assert isinstance(gc.tensor(np.array([0.5, 2.0]))[1].numpy(), np.ndarray)


def test_flatten_of_an_empty_tensor(torch):
    x = np.zeros((0, 3, 4))
    for start, end in [(1, -1), (0, 1), (0, -1), (1, 1)]:
        want = torch.flatten(torch.tensor(x), start, end).shape
        assert F.flatten(gc.tensor(x), start, end).shape == tuple(want)
    assert F.flatten(gc.tensor(np.zeros((2, 0, 3))), 1).shape == (2, 0)


def test_second_order_through_an_index_assignment_whose_value_has_extra_leading_ones():
    """y[-2, ..., :] = v with v (1, 1, 4, 4) into a (1, 4, 4) part: NumPy drops
    v's extra leading 1; recording the backward (for a second order) checked
    SumToLike's shapes, which refused a target with more dims than its input."""
    rng = np.random.default_rng(0)
    x, v = gc.tensor(rng.standard_normal((2, 1, 4, 4))), gc.tensor(rng.standard_normal((1, 1, 4, 4)))
    outer, inner = GradManager().attach([x, v]), GradManager().attach([x, v])
    with outer:
        with inner:
            y = F.copy(x) * 1.0
            y[-2, ..., :] = v
            inner.backward((y * y * y).sum())
        g = v.grad
        x.grad = v.grad = None
        outer.backward(g.sum())
    np.testing.assert_allclose(g.numpy(), 3 * v.numpy() ** 2, rtol=1e-12)
    np.testing.assert_allclose(v.grad.numpy(), 6 * v.numpy(), rtol=1e-12)
    assert v.grad.shape == (1, 1, 4, 4) and not x.grad.numpy().any()


@pytest.mark.parametrize("name, torch_name", [("relu6", "relu6"), ("hsigmoid", "hardsigmoid"),
                                              ("hswish", "hardswish")])
def test_hard_activations_keep_nan(name, torch_name, torch):
    """NaN in, NaN out (relu6 and hsigmoid gave 0), as PyTorch's and as relu,
    clip and maximum; the kinks and the infinities are unchanged."""
    x = np.array([np.nan, -np.inf, -3.0, 0.0, 6.0, 3.0, np.inf])
    xs = gc.tensor(x)
    gm = GradManager().attach([xs])
    with gm:
        y = getattr(F, name)(xs)
        gm.backward(y.sum())
    t = torch.tensor(x, requires_grad=True)
    ty = getattr(torch.nn.functional, torch_name)(t)
    ty.sum().backward()
    assert np.isnan(y.numpy()[0]) and y.numpy()[1] == 0     # (torch's hardswish(-inf) is NaN)
    np.testing.assert_allclose(y.numpy()[2:], ty.detach().numpy()[2:])
    np.testing.assert_allclose(xs.grad.numpy()[1:], t.grad.numpy()[1:])


def test_softmax_over_several_axes_of_an_empty_tensor(torch):
    """As over one axis (and PyTorch's exp(x - logsumexp(x))): an empty result,
    not the max's error for an empty axis; a bad axis still raises."""
    x = np.zeros((2, 0, 3))
    for axis in [(1, 2), (0, 1), 1]:
        out = F.softmax(gc.tensor(x), axis=axis)
        want = torch.softmax(torch.tensor(x), 1)
        assert out.shape == tuple(want.shape) and out.dtype == np.float64
    with pytest.raises(Exception, match="softmax"):
        F.softmax(gc.tensor(x), axis=(1, 5))


def test_repeated_positions_in_an_index_assignment_give_the_overwritten_values_no_gradient(torch):
    """y[i, j] = v with the pair (1, 0) twice: NumPy keeps the last write, so
    the earlier element of v never reaches y and its gradient is 0 (the
    gradient of every element of v was g at its position, counted twice)."""
    rng = np.random.default_rng(0)
    x, v = rng.standard_normal((2, 3)), rng.standard_normal((2, 2))
    i, j = np.array([[0, 1], [1, 1]]), np.array([2, 0])
    w = rng.standard_normal((2, 3))

    def f(x_, v_):
        y = x_ * 1.0
        y[gc.tensor(i), gc.tensor(j)] = v_
        return (y * y * gc.tensor(w)).sum()

    got = _gc_orders(f, [x, v], [[rng.standard_normal(x.shape), rng.standard_normal(v.shape)]])
    assert got[0][1][0, 1] == 0 and got[1][1][0, 1] == 0          # v[0, 1] is overwritten by v[1, 1]
    # PyTorch's index_put leaves the winner of a repeated position unspecified:
    # the same program with only the writes that stand, v[0, 0], v[1, 0], v[1, 1]
    def t(x_, v_):
        y = x_ * 1.0
        y = y.index_put((torch.tensor([0, 1, 1]), torch.tensor([2, 2, 0])), torch.stack([v_[0, 0], v_[1, 0], v_[1, 1]]))
        return (y * y * torch.tensor(w)).sum()

    rs = [[rng.standard_normal(x.shape), rng.standard_normal(v.shape)]]
    got = _gc_orders(f, [x, v], rs)
    want = _torch_orders(torch, t, [x, v], rs)
    for k in range(2):
        for g, tt in zip(got[k], want[k]):
            np.testing.assert_allclose(g, tt, rtol=1e-12, atol=1e-12, err_msg=f"order {k + 1}")


def test_augmented_assignment_at_a_repeated_position_adds_once():
    """y[[2, 1, 1]] += v: NumPy reads y[1] twice and keeps the last write,
    y[1] + v[2]; x[1]'s gradient is 1 (it was 2, the read counted twice) and v[1]'s 0."""
    x, v = gc.tensor(np.arange(4.0)), gc.tensor(np.array([10.0, 20.0, 30.0]))
    gm = GradManager().attach([x, v])
    with gm:
        y = x * 1.0
        y[gc.tensor(np.array([2, 1, 1]))] += v
        gm.backward(y.sum())
    assert y.numpy().tolist() == [0.0, 31.0, 12.0, 3.0]
    assert x.grad.numpy().tolist() == [1.0, 1.0, 1.0, 1.0]
    assert v.grad.numpy().tolist() == [1.0, 0.0, 1.0]


def test_relu_gradient_is_a_selection_not_a_product(torch):
    """sqrt(relu(x)) at x <= 0: the infinite slope of sqrt at 0 times relu's
    zero slope was NaN (g * mask); PyTorch's relu selects: 0."""
    x = np.array([-1.0, 0.0, 4.0])
    got = _gc_orders(lambda t: F.sqrt(F.relu(t)).sum(), [x], [])
    want = _torch_orders(torch, lambda t: torch.sqrt(torch.relu(t)).sum(), [x], [])
    assert got[0][0].tolist() == want[0][0].tolist() == [0.0, 0.0, 0.25]


def test_cosine_similarity_of_a_lower_rank_operand_along_an_axis_it_lacks(torch):
    """x2 (3,) against x1 (2, 3) along axis 0 (or -2): the norms are those of
    the broadcast operands, as PyTorch's (x2's own norm was taken over its only
    axis, and a 0-d x2 raised an error of Reduce)."""
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((2, 3))
    for x2, axis in [(np.array([1.0, 2.0, -1.0]), 0), (np.array(-0.5), -2), (rng.standard_normal((1, 3)), 0)]:
        rs = [[rng.standard_normal(x1.shape), rng.standard_normal(x2.shape)]]
        w = rng.standard_normal(3)
        got = _gc_orders(lambda a, b: (F.nn.cosine_similarity(a, b, axis=axis) * gc.tensor(w)).sum(), [x1, x2], rs)
        want = _torch_orders(torch, lambda a, b: (torch.nn.functional.cosine_similarity(a, b, dim=axis)
                                                  * torch.tensor(w)).sum(), [x1, x2], rs)
        for k in range(2):
            for g, t in zip(got[k], want[k]):
                np.testing.assert_allclose(g, t, rtol=1e-10, atol=1e-12, err_msg=f"order {k + 1}")


def test_binary_cross_entropy_of_a_nan_probability_is_nan():
    """with_logits=False: the log clamped at -100 (PyTorch's) also turned a NaN
    probability (a mean of nothing upstream) into the finite loss 100."""
    loss = F.nn.binary_cross_entropy(gc.tensor([np.nan, 0.0, 0.3]), gc.tensor([0.0, 1.0, 0.0]),
                                     with_logits=False, reduction="none").numpy()
    assert np.isnan(loss[0]) and loss[1] == 100.0
    np.testing.assert_allclose(loss[2], -np.log(0.7))


@pytest.mark.parametrize("ord", [-1, -2, -0.5, 0.5, 3])
def test_norm_with_a_zero_element_has_pytorchs_gradient(ord, torch):
    """A zero element: its power's slope (inf for ord < 1) met abs's zero as
    NaN; PyTorch gives that element 0, and with ord < 0 (norm 0) all of them,
    and the same second order where PyTorch's is a number (at the zero element
    its double backward is NaN, gradcore's 0); a zero row and a row without
    zeros beside it."""
    rng = np.random.default_rng(1)
    x = np.array([[0.0, 1.0, -2.0], [0.5, 1.5, -2.0]])
    rs = [[rng.standard_normal(x.shape)]]
    w = np.array([0.7, -1.3])
    got = _gc_orders(lambda t: (F.norm(t, ord=ord, axis=1) * gc.tensor(w)).sum(), [x], rs)
    want = _torch_orders(torch, lambda t: (torch.linalg.vector_norm(t, ord=ord, dim=1) * torch.tensor(w)).sum(), [x], rs)
    np.testing.assert_allclose(got[0][0], want[0][0], rtol=1e-10, atol=1e-12)
    finite = ~np.isnan(want[1][0])
    assert finite.sum() >= 5 and np.isfinite(got[1][0]).all()
    np.testing.assert_allclose(got[1][0][finite], want[1][0][finite], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode, align_corners", [("bilinear", False), ("bilinear", True), ("bicubic", None)])
def test_interpolate_keeps_a_nan_where_it_is(mode, align_corners, torch):
    """A NaN (or inf) in column 0 leaked, as NaN, into every output whose row
    of weights has fewer taps than the most (the padding taps: weight 0 at
    column 0; 0 * NaN). PyTorch's outputs, bilinear's NaN exactly where its
    are; an inf gives no NaN (PyTorch's NaN beside it are its own zero
    weights times inf)."""
    x = np.arange(12.0).reshape(1, 1, 3, 4)
    for bad in (np.nan, np.inf):
        x[0, 0, 0, 0] = bad
        for sf in [(0.75, 1.5), (1.0, 1.5), (2.0, 2.0)]:
            got = F.nn.interpolate(gc.tensor(x), scale_factor=sf, mode=mode, align_corners=align_corners).numpy()
            want = torch.nn.functional.interpolate(torch.tensor(x), scale_factor=sf, mode=mode, align_corners=align_corners,
                                                   recompute_scale_factor=True).numpy()
            if np.isnan(bad) and mode == "bilinear":
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{sf}")
            # (bicubic: PyTorch also multiplies a NaN by the kernel's exact zeros)
            assert (np.isnan(got) <= np.isnan(want)).all() and np.isnan(got).any() == np.isnan(bad)
            keep = ~np.isnan(want)
            np.testing.assert_allclose(got[keep], want[keep], rtol=1e-12, atol=1e-12)


# ---- round 4: float32, modules in training, autocast -------------------------------


@pytest.mark.parametrize("low, high", [("float16", "float32"), ("float32", "float64")])
@pytest.mark.parametrize("how", ["operator", "function"])
def test_gradient_of_a_promoted_operand_comes_back_in_its_own_dtype(low, high, how):
    """float16 * float32: NumPy's kernel already gives float32, so the
    float16 operand went in uncast and its gradient came back as float32
    (declared float16): ConvTranspose's backward then refused float32 with
    float16, and a float32 leaf's gradient could turn float64."""
    x = gc.tensor(np.arange(9.0, dtype=low).reshape(1, 1, 3, 3))
    w = gc.tensor(np.ones((1, 1, 2, 2), low))
    b = gc.tensor(np.full((1,), 0.5, high))
    gm = GradManager().attach([x, w])
    with gm:
        y = F.conv_transpose2d(x, w)
        z = y * b if how == "operator" else F.mul(y, b)
        assert z.dtype == np.dtype(high)
        gm.backward(z.sum())
    assert x.grad.dtype == np.dtype(low) and w.grad.dtype == np.dtype(low)
    np.testing.assert_allclose(x.grad.numpy(), np.full((1, 1, 3, 3), 2.0))    # 4 taps * 0.5
    np.testing.assert_allclose(w.grad.numpy(), np.full((1, 1, 2, 2), 18.0))   # sum(x) * 0.5
    # the intermediate float16 gradient had the wrong dtype too
    leaf = gc.tensor(np.ones(3, low))
    gm = GradManager().attach([leaf])
    with gm:
        gm.backward(((leaf * 2.0) * b).sum())
    assert leaf.grad.dtype == np.dtype(low)


def test_linear_under_autocast_casts_its_bias_to_float16(torch):
    """MegEngine's linear casts the bias to float16 under autocast, so the
    result is float16 (as torch.autocast's linear); gradcore added a float32
    bias to the float16 product and gave float32."""
    import gradcore.amp as amp
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (4, 3), (4,)))
    gb = gc.Parameter(b)
    gm = GradManager().attach([gb])
    with gm:
        with amp.autocast():
            y = F.linear(gc.tensor(x), gc.tensor(w), gb)
        gm.backward(y.astype("float32").sum())
    with torch.autocast("cpu", dtype=torch.float16):
        want = torch.nn.functional.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b))
    assert y.dtype == np.float16 and want.dtype == torch.float16
    np.testing.assert_allclose(y.numpy().astype(np.float64), want.float().numpy(), rtol=2e-3, atol=2e-3)
    assert gb.grad.dtype == np.float32
    np.testing.assert_array_equal(gb.grad.numpy(), np.full(4, 2.0, np.float32))


def test_float32_sigmoid_and_silu_are_within_5_ulps(torch):
    """float32 sigmoid was exp(-logaddexp(0, -x)), up to 9 ulps off (46% of
    values not correctly rounded): -log(1 - sigmoid(16)) moved by ln 2
    against torch's, whose sigmoid(16) is the correctly rounded 1 - 2^-23."""
    x = np.linspace(-40, 40, 100001).astype(np.float32)
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    for fn, want in ((F.sigmoid, exact), (F.silu, x.astype(np.float64) * exact)):
        got = fn(gc.tensor(x)).numpy()
        assert got.dtype == np.float32
        ref = want.astype(np.float32)
        ulps = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(ref)).astype(np.float64)
        assert ulps.max() <= 4.5, (fn.__name__, ulps.max())     # 9.1 and 9.6 before
    sixteen = np.float32(16.0)
    got = -F.log(1 - F.sigmoid(gc.tensor(sixteen))).item()
    want = -torch.log(1 - torch.sigmoid(torch.tensor(sixteen))).item()
    assert got == want
    np.testing.assert_array_equal(F.sigmoid(gc.tensor(np.array([np.inf, -np.inf, 0.0], np.float32))).numpy(),
                                  [1.0, 0.0, 0.5])
    assert np.isnan(F.sigmoid(gc.tensor(np.float32(np.nan))).item())


# ---- round 7: MegEngine's tie rules, indexing, nn families --------------------------


def test_maximum_and_minimum_give_a_tie_wholly_to_the_first_operand():
    """MegEngine's Elemwise MAX / MIN grads (src/opr/impl/basic_arith.cpp):
    x gets g where y <= x (MIN: x <= y), y only where it is strictly the
    extreme; gradcore split a tie in halves, PyTorch's rule. Broadcast
    operands sum their share; a NaN gives neither operand a gradient."""
    x = np.array([[1.0, 2.0, 0.0], [3.0, np.nan, 0.5]])
    y = np.array([[1.0, 1.0, 0.0]])
    for fn, x_wins in ((F.maximum, x >= y), (F.minimum, x <= y)):
        got = _gc_orders(lambda a, b: fn(a, b).sum(), [x, y], [])[0]
        np.testing.assert_array_equal(got[0], x_wins.astype(float))
        want_y = (~x_wins & ~np.isnan(x)).sum(0, keepdims=True).astype(float)
        np.testing.assert_array_equal(got[1], want_y)
    # second order through the selection: d2/dx2 max(x * x, c) at the tie x * x = c is 2
    e = _gc_orders(lambda a: F.maximum(a * a, gc.tensor(np.array([4.0]))).sum(), [np.array([2.0])], [[np.ones(1)]])
    assert e[0][0].tolist() == [4.0] and e[1][0].tolist() == [2.0]


def test_third_order_through_an_assignment_whose_value_has_an_extra_leading_one():
    """y[()] = v with v (1, 1) into a (1,) y: the third order differentiates
    BroadcastToLike (the backward of the backward's SumToLike), whose gradient
    came back (1,) for its (1, 1) input and was refused. f = sin(x)^2."""
    def f(x):
        y = gc.tensor(np.array([0.5]))
        y[()] = F.reshape(F.sin(x), (1, 1))
        return (y * y).sum()
    x = 0.7
    got = _gc_orders(f, [np.array([x])], [[np.ones(1)], [np.ones(1)]])
    want = [np.sin(2 * x), 2 * np.cos(2 * x), -4 * np.sin(2 * x)]
    for k in range(3):
        np.testing.assert_allclose(got[k][0], [want[k]], rtol=1e-12, err_msg=f"order {k + 1}")
