"""3-d Convolution and its gradient ops (NCDHW): values and gradients against
PyTorch's conv3d over a grid of strides, paddings, dilations and groups;
first and second order against float64 finite differences and torch's
double backward; the backward graph; bad input."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
from gradcore.core import TensorDesc, apply, make_backward_graph
from gradcore.ops import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter
from gradcore.ops import conv as conv_ops
from oracle import compare_second_order

TOL = dict(rtol=1e-10, atol=1e-12)


def Conv3d(stride=1, padding=0, dilation=1, groups=1):
    """Convolution with triples, as F.conv3d builds it (a tuple of another length stays as is)."""
    return Convolution(*(v if isinstance(v, tuple) else (v,) * 3 for v in (stride, padding, dilation)), groups)


def c3d(stride=1, padding=0, dilation=1, groups=1):
    op = Conv3d(stride, padding, dilation, groups)
    return lambda x, w: apply(op, x, w)[0]


def _tp(v):
    return tuple(v) if isinstance(v, (tuple, list)) else v


# x shape, weight shape, stride, padding, dilation, groups
C3 = [
    ((2, 3, 4, 5, 4), (4, 3, 3, 3, 3), 1, 0, 1, 1),
    ((1, 2, 5, 5, 5), (3, 2, 3, 3, 3), 2, 1, 1, 1),
    ((2, 4, 5, 4, 6), (6, 2, 2, 3, 2), (1, 2, 3), (0, 1, 2), (2, 1, 1), 2),   # all asymmetric, grouped
    ((1, 3, 3, 4, 3), (3, 1, 3, 3, 3), 1, 1, 1, 3),                            # depthwise
    ((2, 4, 3, 3, 2), (5, 4, 1, 1, 1), 1, 0, 1, 1),                            # 1x1x1
    ((1, 2, 6, 5, 5), (2, 2, 2, 2, 2), 3, 0, 2, 1),                            # strides leave taps unused
]
C3_PARAMS = [pytest.param(*c, id=f"x{list(c[0])}-w{list(c[1])}-s{c[2]}-p{c[3]}-d{c[4]}-g{c[5]}".replace(" ", ""))
             for c in C3]


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", C3_PARAMS)
def test_conv3d_vs_torch(xs, ws, stride, padding, dilation, groups, rng, h, torch):
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    tfn = lambda x, w: torch.nn.functional.conv3d(x, w, None, _tp(stride), _tp(padding), _tp(dilation), groups)
    h.compare(torch, c3d(stride, padding, dilation, groups), tfn, [x, w], need_grads=True, **TOL)


def test_conv3d_in_small_image_chunks_vs_torch(rng, h, torch, monkeypatch):
    """Several images per chunk and a sum of the filter gradient over chunks."""
    monkeypatch.setattr(conv_ops, "_CHUNK_ELEMS", 200)
    x, w = rng.standard_normal((5, 2, 4, 4, 3)), rng.standard_normal((3, 2, 2, 2, 2))
    tfn = lambda x, w: torch.nn.functional.conv3d(x, w, None, 1, 1)
    h.compare(torch, c3d(1, 1), tfn, [x, w], need_grads=True, **TOL)


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", C3_PARAMS[1:3])
def test_conv3d_second_order_vs_torch(xs, ws, stride, padding, dilation, groups, rng, torch):
    gfn = c3d(stride, padding, dilation, groups)
    tfn = lambda x, w: torch.nn.functional.conv3d(x, w, None, _tp(stride), _tp(padding), _tp(dilation), groups)
    compare_second_order(torch, lambda x, w: gfn(x, w) ** 2, lambda x, w: tfn(x, w) ** 2,
                         [rng.standard_normal(xs), rng.standard_normal(ws)], rng)


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", [
    ((1, 2, 3, 3, 3), (2, 1, 2, 2, 2), 1, 1, 1, 2),
    ((2, 1, 4, 3, 3), (2, 1, 2, 2, 1), (2, 1, 1), (1, 0, 0), (1, 2, 1), 1),
])
def test_conv3d_finite_differences(xs, ws, stride, padding, dilation, groups, rng, h):
    f = c3d(stride, padding, dilation, groups)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    h.check_grads(f, [x, w])
    h.check_grads(lambda x, w: f(x * x, w) * f(x, w * w), [x, w])


def test_float32_matches_float64(rng, h):
    x, w = rng.standard_normal((2, 4, 4, 3, 5)), rng.standard_normal((2, 2, 3, 2, 3))
    f = c3d(2, 1, 1, 2)
    y32 = f(gradcore.Tensor(x.astype("float32")), gradcore.Tensor(w.astype("float32")))
    assert y32.dtype == np.float32
    h.assert_close(y32.numpy(), f(gradcore.Tensor(x), gradcore.Tensor(w)).numpy(), rtol=1e-5, atol=1e-5)


def test_backward_graph_uses_the_gradient_ops():
    x, w = TensorDesc((2, 3, 4, 4, 4), "float64", "cpu"), TensorDesc((4, 3, 3, 3, 3), "float64", "cpu")
    op = Conv3d(1, 1)
    graph, mask, has = make_backward_graph(op, [x, w], [True, False], [True])
    assert has == [True, False] and mask == [False, True, False, True]     # w and dy; x only by shape
    assert [type(o) for o in graph.ops] == [ConvolutionBackwardData]
    graph, mask, _ = make_backward_graph(op, [x, w], [False, True], [True])
    assert mask == [True, False, False, True]
    assert [type(o) for o in graph.ops] == [ConvolutionBackwardFilter]


@pytest.mark.parametrize("xs, ws, kw, needles", [
    ((2, 3, 4, 4, 4), (4, 2, 3, 3, 3), {}, ["Convolution", "channel mismatch", "(2, 3, 4, 4, 4)", "(4, 2, 3, 3, 3)"]),
    ((1, 1, 2, 4, 4), (1, 1, 3, 3, 3), {}, ["larger", "depth"]),
    ((1, 1, 4, 4, 4), (1, 1, 2, 2, 2), dict(dilation=(1, 1, 4)), ["larger", "width", "dilation 4"]),
    ((1, 4, 3, 3, 3), (6, 2, 1, 1, 1), dict(groups=3), ["divisible", "groups=3"]),
    ((1, 4, 3, 3, 3), (5, 2, 1, 1, 1), dict(groups=2), ["output channels 5"]),
    ((3, 4, 4, 4), (1, 3, 1, 1, 1), {}, ["5-D"]),
    ((1, 3, 4, 4, 4), (1, 3, 1, 1), {}, ["weight", "5-D"]),
])
def test_bad_shapes(xs, ws, kw, needles, h):
    with pytest.raises(ValueError) as ei:
        apply(Conv3d(**kw), gradcore.Tensor(np.ones(xs)), gradcore.Tensor(np.ones(ws)))
    h.check_error(ei, *needles)


def test_bad_gradient_shape(h):
    g, w, ref = (gradcore.Tensor(np.ones(s)) for s in ((1, 2, 2, 2, 2), (2, 1, 2, 2, 2), (1, 1, 4, 4, 4)))
    with pytest.raises(ValueError) as ei:
        apply(ConvolutionBackwardData(), g, w, ref)
    h.check_error(ei, "ConvolutionBackwardData", "output gradient must have shape (1, 2, 3, 3, 3)")


@pytest.mark.parametrize("kw, needle", [
    (dict(stride=0), "stride"), (dict(padding=-1), "padding"), (dict(groups=0), "groups"),
    (dict(dilation=(1, 2)), "numbers of spatial axes"),
])
def test_bad_arguments(kw, needle):
    with pytest.raises(ValueError, match=needle):
        Conv3d(**kw)


# ---------------------------------------------------------------- F and M
def test_functional_with_bias_and_grouped_weight_vs_torch(rng, h, torch):
    import gradcore.functional as F
    x, w, b = rng.standard_normal((2, 4, 3, 4, 3)), rng.standard_normal((2, 3, 2, 2, 2, 2)), \
        rng.standard_normal((1, 6, 1, 1, 1))
    gfn = lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=1, groups=2)
    tfn = lambda x, w, b: torch.nn.functional.conv3d(x, w.reshape(6, 2, 2, 2, 2), b.reshape(-1), (1, 2, 1), 1, 1, 2)
    h.compare(torch, gfn, tfn, [x, w, b], need_grads=True, **TOL)
    assert F.nn.conv3d is F.conv3d


@pytest.mark.parametrize("call, needle", [
    (lambda F, x: F.conv3d(x, np.ones((3, 1, 2, 2, 2, 2)), groups=2), "groups=2"),
    (lambda F, x: F.conv3d(x, np.ones((2, 2, 2))), "weight must be"),
    (lambda F, x: F.conv3d(x, np.ones((2, 2, 1, 1, 1)), conv_mode="convolution"), "conv_mode"),
])
def test_functional_errors(call, needle):
    import gradcore.functional as F
    with pytest.raises(ValueError) as ei:
        call(F, gradcore.Tensor(np.ones((1, 2, 3, 3, 3), "float32")))
    assert needle in str(ei.value) and "conv3d" in str(ei.value)


def test_module(rng, h, torch):
    import gradcore.module as M
    gradcore.random.seed(1)
    m = M.Conv3d(4, 6, (3, 2, 2), stride=2, padding=1, groups=2)
    assert m.weight.shape == (2, 3, 2, 3, 2, 2) and m.bias.shape == (1, 6, 1, 1, 1)
    assert sorted(m.state_dict()) == ["bias", "weight"]
    assert M.Conv3d(4, 6, 3, bias=False).bias is None and M.Conv3d(4, 6, 3).weight.shape == (6, 4, 3, 3, 3)
    x = rng.standard_normal((2, 4, 5, 4, 5)).astype("float32")
    want = torch.nn.functional.conv3d(torch.tensor(x), torch.tensor(m.weight.numpy().reshape(6, 2, 3, 2, 2)),
                                      torch.tensor(m.bias.numpy().reshape(-1)), 2, 1, 1, 2)
    h.assert_close(m(gradcore.Tensor(x)).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    gradcore.random.seed(0)
    w = M.Conv3d(32, 8, 3).weight.numpy()
    assert abs(w.std() / np.sqrt(1 / (27 * 32)) - 1) < 0.05      # MegEngine: fan_in = kd * kh * kw * in_channels


def test_a_small_3d_net_trains(rng):
    import gradcore.functional as F
    import gradcore.module as M
    import gradcore.optimizer as optim
    gradcore.random.seed(0)
    conv, up = M.Conv3d(1, 4, 3, stride=2, padding=1), M.ConvTranspose2d(4, 1, 2, stride=2)
    params = list(conv.parameters()) + list(up.parameters())
    opt, gm = optim.Adam(params, lr=0.05), gradcore.GradManager().attach(params)
    x = gradcore.Tensor(rng.standard_normal((4, 1, 2, 6, 6)).astype("float32"))
    target = gradcore.Tensor(rng.standard_normal((4, 1, 6, 6)).astype("float32"))
    losses = []
    for _ in range(30):
        with gm:
            h = F.relu(conv(x))                                    # (4, 4, 1, 3, 3)
            y = up(h.reshape((4, 4, 3, 3)))                        # (4, 1, 6, 6)
            loss = ((y - target) ** 2).mean()
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(float(loss.item()))
    assert losses[-1] < 0.7 * losses[0]
