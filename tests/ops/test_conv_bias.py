"""The convolution with its bias as one op (issue 25, item 1): F.conv1d/2d/3d
with a per-channel bias, PyTorch's (O,) or MegEngine's (1, O, 1, ...),
record one Convolution node with the bias as its third input; its backward
gives the bias gradient from ConvolutionBackwardFilter (one oneDNN
primitive with the weight gradient), or from one reduction when the weight
is frozen. F.conv_transpose1d/2d/3d likewise record one ConvTranspose node
(the bias added in place after its kernel; its gradient one reduction). Values and gradients against PyTorch (float64), both orders
against finite differences and torch's double backward, the backward
graphs, the forms that stay a separate broadcast add, errors."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
import gradcore.module as M
from gradcore import _core
from gradcore.autodiff import GradManager
from gradcore.core import TensorDesc, make_backward_graph
from gradcore.ops import ConvTranspose, Convolution, ConvolutionBackwardFilter, Reduce, ReshapeLike
from gradcore.testing import check_op

from oracle import compare_second_order

TOL = dict(rtol=1e-10, atol=1e-12)

# n spatial axes, x shape, weight shape, stride, padding, dilation, groups
CASES = {
    "1d": (1, (2, 3, 9), (4, 3, 3), 1, 1, 1, 1),
    "1d-strided-grouped": (1, (2, 4, 10), (6, 2, 3), 2, 0, 2, 2),
    "2d": (2, (2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1, 1),
    "2d-strided": (2, (2, 3, 7, 7), (5, 3, 3, 2), (2, 1), (1, 0), 1, 1),
    "2d-grouped": (2, (2, 4, 5, 5), (6, 2, 3, 3), 1, 1, (1, 2), 2),
    "2d-depthwise": (2, (1, 3, 5, 4), (3, 1, 3, 3), 2, 1, 1, 3),
    "3d": (3, (1, 2, 4, 5, 4), (3, 2, 2, 3, 2), (1, 2, 1), 1, 1, 1),
    "3d-grouped": (3, (2, 4, 3, 4, 3), (4, 2, 2, 2, 2), 1, (1, 0, 1), 1, 2),
}
FORMS = ["torch (O,)", "megengine (1, O, 1, ...)"]


def _bias(rng, n, o, form):
    b = rng.standard_normal(o)
    return b if form == FORMS[0] else b.reshape((1, o) + (1,) * n)


def _fns(torch, n, stride, padding, dilation, groups):
    g = {1: F.nn.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
    t = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[n]
    tp = lambda v: tuple(v) if isinstance(v, tuple) else v
    gfn = lambda x, w, b: g(x, w, b, stride, padding, dilation, groups)
    tfn = lambda x, w, b: t(x, w, b.reshape(-1), tp(stride), tp(padding), tp(dilation), groups)
    return gfn, tfn


def _case(case, torch):
    """(n, x shape, weight shape, output channels, gradcore fn, torch fn) of
    a CASES key, or of a TCASES key prefixed "transpose " (conv_transpose)."""
    if case.startswith("transpose "):
        n, xs, ws, *attrs = TCASES[case[len("transpose "):]]
        return (n, xs, ws, ws[1] * attrs[-1]) + _tfns(torch, n, *attrs)
    n, xs, ws, *attrs = CASES[case]
    return (n, xs, ws, ws[0]) + _fns(torch, n, *attrs)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", list(CASES) + ["transpose 1d", "transpose 2d", "transpose 2d-grouped",
                                                "transpose 3d"])
def test_values_and_gradients_vs_torch(case, form, rng, h, torch):
    n, xs, ws, o, gfn, tfn = _case(case, torch)
    h.compare(torch, gfn, tfn, [rng.standard_normal(xs), rng.standard_normal(ws), _bias(rng, n, o, form)],
              need_grads=True, **TOL)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", ["1d-strided-grouped", "2d-grouped", "3d", "transpose 1d", "transpose 2d-grouped"])
def test_second_order_vs_torch_double_backward(case, form, rng, torch):
    n, xs, ws, o, gfn, tfn = _case(case, torch)
    # a nonlinearity after the convolution: the second derivative reaches the bias
    compare_second_order(torch, lambda *t: gfn(*t) ** 2, lambda *t: tfn(*t) ** 2,
                         [rng.standard_normal(xs), rng.standard_normal(ws), _bias(rng, n, o, form)], rng)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", ["1d", "2d-strided", "2d-grouped", "3d-grouped"])
def test_both_orders_against_finite_differences(case, form, rng, h):
    n, xs, ws, *attrs = CASES[case]
    g = {1: F.nn.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
    fn = lambda x, w, b: F.tanh(g(x, w, b, *attrs))
    h.check_grads(fn, [rng.standard_normal(xs), rng.standard_normal(ws), _bias(rng, n, ws[0], form)],
                  dtype=np.float64)


def _recorded_ops(y):
    (record,) = _core._recorded_graph(y, ())
    return [node[1] for node in record[2]]


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("form", FORMS)
def test_conv_with_bias_records_one_op(n, form, rng):
    x = gradcore.tensor(rng.standard_normal((2, 3) + (5,) * n).astype("float32"))
    w = gradcore.tensor(rng.standard_normal((4, 3) + (3,) * n).astype("float32"))
    b = gradcore.tensor(_bias(rng, n, 4, form).astype("float32"))
    fn = {1: F.nn.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
    gm = GradManager().attach([x, w, b])
    with gm:
        y = fn(x, w, b, padding=1)
        ops = _recorded_ops(y)
        gm.backward(y.sum())
    assert len(ops) == 1 and isinstance(ops[0], Convolution), ops
    assert b.grad.shape == b.shape
    np.testing.assert_allclose(b.grad.numpy().reshape(-1), np.full(4, y.size // 4), rtol=1e-6)


@pytest.mark.parametrize("module", [lambda: M.Conv1d(3, 4, 3, padding=1), lambda: M.Conv2d(3, 4, 3, padding=1),
                                    lambda: M.Conv3d(3, 4, 3, padding=1)])
def test_conv_modules_record_one_op(module, rng):
    m = module()
    n = m.weight.ndim - 2
    x = gradcore.tensor(rng.standard_normal((2, 3) + (5,) * n).astype("float32"))
    gm = GradManager().attach(m.parameters())
    with gm:
        y = m(x)
        ops = _recorded_ops(y)
        gm.backward(y.sum())
    assert [type(o) for o in ops] == [Convolution]
    assert m.bias.grad is not None and m.bias.grad.shape == m.bias.shape


def test_other_bias_forms_stay_a_broadcast_add(rng):
    """What the op does not take is added after it, with the broadcast's
    meaning: a bias per element, a bias with fewer leading axes, a scalar
    bias (1,), a float64 bias on a float32 convolution (promotes), and
    conv_transpose (no bias input)."""
    x = rng.standard_normal((2, 3, 5, 5)).astype("float32")
    w = rng.standard_normal((4, 3, 3, 3)).astype("float32")
    ref = F.conv2d(gradcore.tensor(x), gradcore.tensor(w), padding=1).numpy()
    for b in [rng.standard_normal((1, 4, 5, 5)), rng.standard_normal((4, 1, 1)), rng.standard_normal(1)]:
        b = b.astype("float32")
        xt, wt, bt = gradcore.tensor(x), gradcore.tensor(w), gradcore.tensor(b)
        gm = GradManager().attach([xt, wt, bt])
        with gm:
            y = F.conv2d(xt, wt, bt, padding=1)
            ops = _recorded_ops(y)
            gm.backward(y.sum())
        assert [type(o).__name__ for o in ops] == ["Convolution", "Elemwise"]
        np.testing.assert_allclose(y.numpy(), ref + b, rtol=1e-5, atol=1e-5)
        assert bt.grad.shape == b.shape
    y = F.conv2d(gradcore.tensor(x), gradcore.tensor(w), gradcore.tensor(np.ones(4)), padding=1)
    assert y.dtype == np.float64      # conv in float32, then the add promotes, as before
    np.testing.assert_allclose(y.numpy(), ref.astype(np.float64) + 1, rtol=1e-6)
    xt = gradcore.tensor(x)
    gm = GradManager().attach([xt])
    with gm:       # a per-element bias on a transposed convolution: also an add after it
        y = F.conv_transpose2d(xt, gradcore.tensor(w.transpose(1, 0, 2, 3).copy()),
                               gradcore.tensor(np.ones((1, 4, 7, 7), "f4")))
        assert [type(o).__name__ for o in _recorded_ops(y)] == ["ConvTranspose", "Elemwise"]


def test_mixed_float_widths_fuse_in_the_promoted_dtype(rng, torch):
    # float16 input, float32 weight and bias: the convolution is float32 either way
    x = rng.standard_normal((1, 2, 5, 5)).astype("float16")
    w, b = rng.standard_normal((3, 2, 3, 3)).astype("float32"), rng.standard_normal(3).astype("float32")
    xt = gradcore.tensor(x)
    gm = GradManager().attach([xt])
    with gm:
        y = F.conv2d(xt, gradcore.tensor(w), gradcore.tensor(b))
        assert [type(o).__name__ for o in _recorded_ops(y)] == ["Cast", "Convolution"]
    want = torch.nn.functional.conv2d(torch.tensor(x.astype("float32")), torch.tensor(w), torch.tensor(b))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_non_tensor_bias_is_converted_like_the_output(rng, torch):
    x, w = rng.standard_normal((1, 2, 5, 5)).astype("float32"), rng.standard_normal((3, 2, 3, 3)).astype("float32")
    b = [0.5, -1.0, 2.0]
    y = F.conv2d(gradcore.tensor(x), gradcore.tensor(w), b)
    assert y.dtype == np.float32
    want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b))
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- backward graphs
D = TensorDesc(None, "float32", "cpu")


def test_backward_graph_weight_and_bias_from_one_op():
    graph, mask, has = make_backward_graph(Convolution((1, 1), (1, 1)), [D, D, D], [True, True, True], [True])
    assert has == [True, True, True]
    filt = [o for o in graph.ops if isinstance(o, ConvolutionBackwardFilter)]
    assert len(filt) == 1 and len(graph.nodes[-1].outs) == 2
    assert mask[:3] == [True, True, False]        # x and w kept; b only by its shape


def test_backward_graph_frozen_weight_reduces_g_and_keeps_no_input():
    graph, mask, has = make_backward_graph(Convolution((2, 1), (1, 1)), [D, D, D], [False, False, True], [True])
    assert has == [False, False, True]
    assert [type(o) for o in graph.ops] == [Reduce, ReshapeLike]
    assert graph.ops[0].axis == (0, 2, 3)
    assert mask == [False, False, False, False, True]       # only the output gradient


def test_backward_graph_frozen_bias_runs_the_plain_filter_gradient():
    graph, _, has = make_backward_graph(Convolution(1, 1), [D, D, D], [True, True, False], [True])
    assert has == [True, True, False]
    filt = [n for n in graph.nodes if isinstance(n.op, ConvolutionBackwardFilter)]
    assert len(filt) == 1 and len(filt[0].args) == 3 and len(filt[0].outs) == 1


def test_frozen_weight_gradients_match(rng, torch):
    # weight not attached: the bias gradient by the reduction, any bias form
    for n, form in [(1, FORMS[0]), (2, FORMS[1]), (3, FORMS[0])]:
        x = rng.standard_normal((2, 3) + (4,) * n)
        w, b = rng.standard_normal((4, 3) + (3,) * n), _bias(rng, n, 4, form)
        xt, bt = gradcore.tensor(x), gradcore.tensor(b)
        gm = GradManager().attach([xt, bt])
        fn = {1: F.nn.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
        with gm:
            gm.backward(F.sum(fn(xt, gradcore.tensor(w), bt, 2, 1) ** 2))
        tx, tb = torch.tensor(x, requires_grad=True), torch.tensor(b.reshape(-1), requires_grad=True)
        tf = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[n]
        (tf(tx, torch.tensor(w), tb, 2, 1) ** 2).sum().backward()
        np.testing.assert_allclose(bt.grad.numpy().reshape(-1), tb.grad.numpy(), **TOL)
        np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), **TOL)
        assert bt.grad.shape == b.shape


# ---------------------------------------------------------------- the ops directly
def test_check_op_passes_with_bias_examples():
    for cls in (Convolution, ConvolutionBackwardFilter):
        report = check_op(cls)
        assert report.ok, report


def test_filter_gradient_returns_the_bias_gradient_shaped_like_b(rng):
    g, x = rng.standard_normal((2, 4, 5, 5)), rng.standard_normal((2, 3, 5, 5))
    w = rng.standard_normal((4, 3, 3, 3))
    plain = ConvolutionBackwardFilter(1, 1)(gradcore.tensor(g), gradcore.tensor(x), gradcore.tensor(w)).numpy()
    for b in (np.zeros(4), np.zeros((1, 4, 1, 1))):
        dw, db = ConvolutionBackwardFilter(1, 1)(gradcore.tensor(g), gradcore.tensor(x), gradcore.tensor(w),
                                                 gradcore.tensor(b))
        np.testing.assert_allclose(dw.numpy(), plain, **TOL)
        np.testing.assert_allclose(db.numpy(), g.sum(axis=(0, 2, 3)).reshape(b.shape), **TOL)


@pytest.mark.parametrize("bshape", [(5,), (4, 1), (1, 4, 1), (1, 4, 1, 2), (4, 1, 1)])
def test_a_bias_the_op_does_not_take_names_it(bshape):
    x, w = gradcore.tensor(np.ones((1, 3, 5, 5))), gradcore.tensor(np.ones((4, 3, 3, 3)))
    with pytest.raises(ValueError, match=r"Convolution.*bias must have one value per output channel, shaped "
                                         r"\(4,\) or \(1, 4, 1, 1\)"):
        Convolution(1, 1)(x, w, gradcore.tensor(np.ones(bshape)))
    with pytest.raises(ValueError, match=r"ConvolutionBackwardFilter.*bias"):
        ConvolutionBackwardFilter(1, 1)(gradcore.tensor(np.ones((1, 4, 5, 5))), x, w, gradcore.tensor(np.ones(bshape)))


def test_the_bias_is_promoted_with_the_other_inputs():
    x, w = gradcore.tensor(np.ones((1, 3, 5, 5), "float32")), gradcore.tensor(np.ones((4, 3, 3, 3), "float32"))
    assert Convolution(1, 1)(x, w, gradcore.tensor(np.ones(4, "float64"))).dtype == np.float64
    assert Convolution(1, 1)(x, w, gradcore.tensor(np.ones(4, "int32"))).dtype == np.float32
    with pytest.raises(ValueError, match="Convolution.*floating-point"):
        Convolution(1, 1)(gradcore.tensor(np.ones((1, 3, 5, 5), "int32")), gradcore.tensor(np.ones((4, 3, 3, 3), "int32")),
                          gradcore.tensor(np.ones(4, "int32")))


def test_empty_batch_with_bias(rng):
    x = gradcore.tensor(np.zeros((0, 3, 5, 5), "float32"))
    w, b = gradcore.tensor(np.ones((4, 3, 3, 3), "float32")), gradcore.tensor(np.ones(4, "float32"))
    gm = GradManager().attach([w, b])
    with gm:
        y = F.conv2d(x, w, b, padding=1)
        gm.backward(y.sum())
    assert y.shape == (0, 4, 5, 5)
    assert not np.any(w.grad.numpy()) and not np.any(b.grad.numpy())


# ---------------------------------------------------------------- conv_transpose with its bias
# n spatial axes, x shape, weight shape (C_in, C_out // groups, *kernel), stride, padding, output_padding,
# dilation, groups
TCASES = {
    "1d": (1, (2, 3, 6), (3, 4, 3), 2, 1, 1, 1, 1),
    "2d": (2, (2, 4, 4, 5), (4, 3, 3, 2), (2, 1), (1, 0), (1, 0), 1, 1),
    "2d-grouped": (2, (1, 4, 4, 4), (4, 2, 3, 3), 2, 1, 0, (1, 2), 2),
    "3d": (3, (1, 2, 3, 4, 3), (2, 3, 2, 3, 2), (1, 2, 1), 1, 0, 1, 1),
}


def _tfns(torch, n, stride, padding, output_padding, dilation, groups):
    g = {1: F.nn.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
    t = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
         3: torch.nn.functional.conv_transpose3d}[n]
    tp = lambda v: tuple(v) if isinstance(v, tuple) else v
    gfn = lambda x, w, b: g(x, w, b, stride, padding, output_padding, dilation, groups)
    tfn = lambda x, w, b: t(x, w, b.reshape(-1), tp(stride), tp(padding), tp(output_padding), groups, tp(dilation))
    return gfn, tfn


@pytest.mark.parametrize("layout", ["float32", "float32 frozen weight"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_conv_transpose_with_bias_records_one_op(n, layout, rng, torch):
    """One ConvTranspose node with b as its third input (float32: on oneDNN
    where it loads); the bias gradient a sum of g, shaped like b, with the
    weight attached or frozen."""
    x = rng.standard_normal((2, 3) + (4,) * n).astype("float32")
    w = rng.standard_normal((3, 2) + (3,) * n).astype("float32")
    b = rng.standard_normal(2).astype("float32")
    xt, wt, bt = gradcore.tensor(x), gradcore.tensor(w), gradcore.tensor(b)
    gm = GradManager().attach([xt, bt] if "frozen" in layout else [xt, wt, bt])
    fn = {1: F.nn.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
    with gm:
        y = fn(xt, wt, bt, stride=2, padding=1)
        ops = _recorded_ops(y)
        gm.backward((y * y).sum())
    assert [type(o) for o in ops] == [ConvTranspose]
    tf = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
          3: torch.nn.functional.conv_transpose3d}[n]
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = tf(tx, tw, tb, stride=2, padding=1)
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bt.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    if "frozen" not in layout:
        np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv_transpose_backward_graph_bias_by_one_reduction():
    graph, mask, has = make_backward_graph(ConvTranspose((2, 1), (1, 1)), [D, D, D], [False, False, True], [True])
    assert has == [False, False, True]
    assert [type(o) for o in graph.ops] == [Reduce, ReshapeLike]
    assert graph.ops[0].axis == (0, 2, 3)
    graph, _, has = make_backward_graph(ConvTranspose((2, 1), (1, 1)), [D, D, D], [True, True, True], [True])
    assert has == [True, True, True]
    assert sorted(type(o).__name__ for o in graph.ops) == ["Convolution", "ConvolutionBackwardFilter", "Reduce",
                                                          "ReshapeLike"]


def test_conv_transpose_check_op_with_bias_examples():
    report = check_op(ConvTranspose)
    assert report.ok, report


@pytest.mark.parametrize("bshape", [(3,), (6, 1), (1, 6, 1), (1, 6, 1, 2)])
def test_conv_transpose_bias_the_op_does_not_take_names_it(bshape):
    x, w = gradcore.tensor(np.ones((1, 4, 3, 3))), gradcore.tensor(np.ones((4, 3, 2, 2)))
    with pytest.raises(ValueError, match=r"ConvTranspose.*bias must have one value per output channel, shaped "
                                         r"\(6,\) or \(1, 6, 1, 1\)"):
        ConvTranspose(1, 0, 0, 1, 2)(x, w, gradcore.tensor(np.ones(bshape)))


def test_conv_transpose_module_records_one_op(rng):
    m = M.ConvTranspose2d(3, 4, 3, stride=2, padding=1)
    x = gradcore.tensor(rng.standard_normal((2, 3, 4, 4)).astype("float32"))
    gm = GradManager().attach(m.parameters())
    with gm:
        y = m(x)
        ops = _recorded_ops(y)
        gm.backward(y.sum())
    assert [type(o) for o in ops] == [ConvTranspose]
    assert m.bias.grad.shape == m.bias.shape
    np.testing.assert_allclose(m.bias.grad.numpy().reshape(-1), np.full(4, y.size // 4), rtol=1e-6)
