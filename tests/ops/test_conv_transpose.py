"""ConvTranspose (1-d, 2-d, 3-d): values and
gradients against PyTorch's conv_transpose1d/2d/3d over a grid of strides,
paddings, output paddings, dilations and groups; first and second order
against float64 finite differences and against torch's double backward;
the backward graph; bad input."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
from gradcore.core import TensorDesc, apply, make_backward_graph
from gradcore.ops import ConvolutionBackwardFilter, Convolution, ConvTranspose
from oracle import compare_second_order

TOL = dict(rtol=1e-10, atol=1e-12)


def ConvTranspose2d(stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """ConvTranspose with pairs, as F.conv_transpose2d builds it (a tuple of another length stays as is)."""
    return ConvTranspose(*(v if isinstance(v, tuple) else (v, v) for v in (stride, padding, output_padding, dilation)),
                         groups)


def ct2d(stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    op = ConvTranspose2d(stride, padding, output_padding, dilation, groups)
    return lambda x, w: apply(op, x, w)[0]


def _tp(v):
    return tuple(v) if isinstance(v, (tuple, list)) else v


# x shape, weight shape (C_in, C_out // groups, KH, KW), stride, padding, output_padding, dilation, groups
CT = [
    ((2, 3, 4, 4), (3, 2, 3, 3), 1, 0, 0, 1, 1),
    ((1, 3, 3, 4), (3, 4, 3, 3), 2, 1, 1, 1, 1),                    # the usual 2x upsampling
    ((2, 4, 3, 3), (4, 3, 2, 3), (2, 3), (1, 0), (1, 2), (1, 2), 2),  # everything asymmetric, grouped
    ((2, 4, 3, 2), (4, 1, 3, 3), 1, 1, 0, 2, 4),                    # depthwise, dilated
    ((1, 2, 3, 3), (2, 3, 1, 1), 2, 0, 1, 1, 1),                    # 1x1, strided
    ((2, 2, 2, 3), (2, 2, 4, 4), 3, 2, 2, 1, 1),                    # padding crops, big output_padding
    ((1, 6, 2, 2), (6, 2, 2, 2), 2, 0, 0, 3, 3),
]
CT_PARAMS = [pytest.param(*c, id=f"x{list(c[0])}-w{list(c[1])}-s{c[2]}-p{c[3]}-op{c[4]}-d{c[5]}-g{c[6]}"
                          .replace(" ", "")) for c in CT]


@pytest.mark.parametrize("xs, ws, stride, padding, out_pad, dilation, groups", CT_PARAMS)
def test_conv_transpose2d_vs_torch(xs, ws, stride, padding, out_pad, dilation, groups, rng, h, torch):
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    tfn = lambda x, w: torch.nn.functional.conv_transpose2d(x, w, None, _tp(stride), _tp(padding), _tp(out_pad),
                                                            groups, _tp(dilation))
    h.compare(torch, ct2d(stride, padding, out_pad, dilation, groups), tfn, [x, w], need_grads=True, **TOL)


@pytest.mark.parametrize("xs, ws, stride, padding, out_pad, dilation, groups", CT_PARAMS[1:4])
def test_conv_transpose2d_second_order_vs_torch(xs, ws, stride, padding, out_pad, dilation, groups, rng, torch):
    gfn = ct2d(stride, padding, out_pad, dilation, groups)
    tfn = lambda x, w: torch.nn.functional.conv_transpose2d(x, w, None, _tp(stride), _tp(padding), _tp(out_pad),
                                                            groups, _tp(dilation))
    # squared: the second derivative then depends on x and w together
    compare_second_order(torch, lambda x, w: gfn(x, w) ** 2, lambda x, w: tfn(x, w) ** 2,
                         [rng.standard_normal(xs), rng.standard_normal(ws)], rng)


@pytest.mark.parametrize("stride, padding, out_pad, dilation, groups", [
    (1, 0, 0, 1, 1), (2, 1, 1, 1, 2), (3, 0, 2, 2, 1)])
def test_conv_transpose1d_vs_torch(stride, padding, out_pad, dilation, groups, rng, h, torch):
    x, w = rng.standard_normal((2, 4, 5)), rng.standard_normal((4, 3, 3))
    op = ConvTranspose((stride,), (padding,), (out_pad,), (dilation,), groups)
    tfn = lambda x, w: torch.nn.functional.conv_transpose1d(x, w, None, stride, padding, out_pad, groups, dilation)
    h.compare(torch, lambda x, w: apply(op, x, w)[0], tfn, [x, w], need_grads=True, **TOL)


@pytest.mark.parametrize("stride, padding, out_pad, dilation, groups", [
    (1, 0, 0, 1, 1), ((2, 1, 2), 1, (1, 0, 0), 1, 2), (2, (0, 1, 0), 1, (2, 1, 1), 1)])
def test_conv_transpose3d_vs_torch(stride, padding, out_pad, dilation, groups, rng, h, torch):
    import gradcore.functional as F
    x, w = rng.standard_normal((2, 4, 3, 2, 3)), rng.standard_normal((4, 3, 2, 3, 2))
    gfn = lambda x, w: F.conv_transpose3d(x, w, None, stride, padding, out_pad, dilation, groups)
    tfn = lambda x, w: torch.nn.functional.conv_transpose3d(x, w, None, _tp(stride), _tp(padding), _tp(out_pad),
                                                            groups, _tp(dilation))
    h.compare(torch, gfn, tfn, [x, w], need_grads=True, **TOL)
    h.check_grads(gfn, [x[:1, :, :2], w])


@pytest.mark.parametrize("xs, ws, stride, padding, out_pad, dilation, groups", [
    ((1, 2, 3, 3), (2, 2, 2, 2), 2, 1, 1, 1, 1),
    ((2, 4, 2, 3), (4, 1, 3, 2), (1, 2), (0, 1), (0, 1), (2, 1), 2),
])
def test_conv_transpose2d_finite_differences(xs, ws, stride, padding, out_pad, dilation, groups, rng, h):
    f = ct2d(stride, padding, out_pad, dilation, groups)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    h.check_grads(f, [x, w])
    h.check_grads(lambda x, w: f(x * x, w) * f(x, w * w), [x, w])     # nonlinear in both


def test_float32_matches_float64(rng, h):
    x, w = rng.standard_normal((2, 4, 3, 3)), rng.standard_normal((4, 3, 3, 3))
    f = ct2d(2, 1, 1, 1, 2)
    y32 = f(gradcore.Tensor(x.astype("float32")), gradcore.Tensor(w.astype("float32")))
    assert y32.dtype == np.float32
    h.assert_close(y32.numpy(), f(gradcore.Tensor(x), gradcore.Tensor(w)).numpy(), rtol=1e-5, atol=1e-5)


def test_backward_is_the_convolution_ops():
    """x's gradient is Convolution(g, w), w's ConvolutionBackwardFilter(x, g, w): only
    w and g are kept for x's, x and g for w's (w by shape)."""
    x, w = TensorDesc((2, 3, 4, 4), "float64", "cpu"), TensorDesc((3, 2, 3, 3), "float64", "cpu")
    op = ConvTranspose2d(2, 1, 1)
    graph, mask, has = make_backward_graph(op, [x, w], [True, False], [True])
    assert has == [True, False] and mask == [False, True, False, True]
    assert [type(o) for o in graph.ops] == [Convolution]
    graph, mask, _ = make_backward_graph(op, [x, w], [False, True], [True])
    assert mask == [True, False, False, True]
    assert [type(o) for o in graph.ops] == [ConvolutionBackwardFilter]
    assert graph.ops[0] == ConvolutionBackwardFilter((2, 2), (1, 1))     # the same stride, padding, dilation, groups


@pytest.mark.parametrize("xs, ws, kw, needles", [
    ((2, 3, 4, 4), (2, 2, 3, 3), {}, ["ConvTranspose", "channel mismatch", "(2, 3, 4, 4)", "(2, 2, 3, 3)"]),
    ((2, 3, 4), (3, 2, 3, 3), {}, ["ConvTranspose", "4-D"]),
    ((2, 3, 4, 4), (3, 2, 3), {}, ["ConvTranspose", "weight", "4-D"]),
    ((2, 3, 4, 4), (3, 2, 3, 3), dict(groups=2), ["divisible", "groups=2"]),
    ((1, 1, 1, 1), (1, 1, 1, 1), dict(padding=1), ["output size", "not positive"]),
])
def test_bad_shapes(xs, ws, kw, needles, h):
    op = ConvTranspose2d(**kw)
    with pytest.raises(ValueError) as ei:
        apply(op, gradcore.Tensor(np.ones(xs)), gradcore.Tensor(np.ones(ws)))
    h.check_error(ei, *needles)


@pytest.mark.parametrize("kw, needle", [
    (dict(stride=2, output_padding=2), "output_padding"),
    (dict(stride=0), "stride"),
    (dict(padding=-1), "padding"),
    (dict(groups=0), "groups"),
    (dict(stride=(1, 2, 3)), "numbers of spatial axes"),
])
def test_bad_arguments(kw, needle):
    with pytest.raises(ValueError, match=needle):
        ConvTranspose2d(**kw)


def test_integer_input_is_rejected(h):
    # integer input and weight: no float to promote to (as Convolution)
    with pytest.raises(ValueError) as ei:
        apply(ConvTranspose2d(), gradcore.Tensor(np.ones((1, 1, 2, 2), "int32")),
              gradcore.Tensor(np.ones((1, 1, 1, 1), "int32")))
    h.check_error(ei, "ConvTranspose", "floating-point")


def test_mixed_dtypes_promote_as_conv2d():
    # the dtype rules (gradcore/dtypes.py): an integer input with a float weight,
    # or two float widths, compute in the wider float
    x16 = gradcore.Tensor(np.ones((1, 1, 2, 2), "float16"))
    (y,) = apply(ConvTranspose2d(), x16, gradcore.Tensor(np.ones((1, 1, 1, 1), "float32")))
    assert y.dtype == np.float32
    (y,) = apply(ConvTranspose2d(), gradcore.Tensor(np.ones((1, 1, 2, 2), "int32")),
                 gradcore.Tensor(np.ones((1, 1, 1, 1))))
    assert y.dtype == np.float64


# ---------------------------------------------------------------- F and M
def test_functional_with_bias_and_grouped_weight_vs_torch(rng, h, torch):
    import gradcore.functional as F
    x, w, b = rng.standard_normal((2, 4, 3, 3)), rng.standard_normal((2, 2, 3, 3, 3)), rng.standard_normal(6)
    gfn = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2)
    tfn = lambda x, w, b: torch.nn.functional.conv_transpose2d(x, w.reshape(4, 3, 3, 3), b, 2, 1, 1, 2)
    h.compare(torch, gfn, tfn, [x, w, b], need_grads=True, **TOL)
    assert F.nn.conv_transpose2d is F.conv_transpose2d


def test_functional_1d_with_bias_vs_torch(rng, h, torch):
    import gradcore.functional as F
    x, w, b = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 2, 3, 3)), rng.standard_normal((1, 6, 1))
    gfn = lambda x, w, b: F.nn.conv_transpose1d(x, w, b, 2, 1, 1, 1, 2)
    tfn = lambda x, w, b: torch.nn.functional.conv_transpose1d(x, w.reshape(4, 3, 3), b.reshape(-1), 2, 1, 1, 2)
    h.compare(torch, gfn, tfn, [x, w, b], need_grads=True, **TOL)
    h.check_grads(gfn, [x[:1, :, :3], w, b])


@pytest.mark.parametrize("call, needle", [
    (lambda F, x: F.conv_transpose2d(x, np.ones((2, 1, 1, 2, 2)), groups=1), "groups=1"),
    (lambda F, x: F.conv_transpose2d(x, np.ones((2, 2))), "weight must be"),
    (lambda F, x: F.conv_transpose2d(x, np.ones((2, 1, 2, 2)), conv_mode="convolution"), "conv_mode"),
    (lambda F, x: F.conv_transpose2d(x, np.ones((2, 1, 2, 2), "float32"), np.ones(3, "float32")), "one element per output channel"),
    (lambda F, x: F.nn.conv_transpose1d(x, np.ones((2, 1, 2), "float32")), "(N, C, L)"),
    (lambda F, x: F.conv_transpose3d(x, np.ones((2, 1, 2, 2, 2), "float32")), "(N, C, D, H, W)"),
    (lambda F, x: F.nn.conv_transpose1d(x.reshape(1, 2, 9), np.ones((2, 1, 2), "float32"), stride=(1, 2)), "stride"),
])
def test_functional_errors(call, needle):
    import gradcore.functional as F
    x = gradcore.Tensor(np.ones((1, 2, 3, 3), "float32"))
    with pytest.raises((ValueError, TypeError)) as ei:
        call(F, x)
    assert needle in str(ei.value) and ("conv_transpose" in str(ei.value) or "ConvTranspose" in str(ei.value))


def test_module(rng, h, torch):
    import gradcore.module as M
    gradcore.random.seed(3)
    m = M.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    assert m.weight.shape == (2, 2, 3, 3, 3) and m.bias.shape == (1, 6, 1, 1)
    assert sorted(m.state_dict()) == ["bias", "weight"]
    assert not np.any(m.bias.numpy())
    assert M.ConvTranspose2d(4, 6, 3).weight.shape == (4, 6, 3, 3)
    x = rng.standard_normal((2, 4, 5, 5)).astype("float32")
    want = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(m.weight.numpy().reshape(4, 3, 3, 3)),
                                                torch.tensor(m.bias.numpy().reshape(-1)), 2, 1, 1, 2)
    h.assert_close(m(gradcore.Tensor(x)).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert "output_padding=(1, 1)" in repr(m) and "groups=2" in repr(m)


def test_module_init_scale():
    import gradcore.module as M
    gradcore.random.seed(0)
    w = M.ConvTranspose2d(64, 32, 3).weight.numpy()
    assert abs(w.std() / np.sqrt(1 / (9 * 32)) - 1) < 0.05       # MegEngine: fan_in = kh * kw * out_channels
    assert abs(w.mean()) < 0.01


@pytest.mark.parametrize("kw, needle", [
    (dict(groups=3), "divisible by groups=3"), (dict(output_padding=1), "output_padding"),
    (dict(kernel_size=0), "kernel_size"), (dict(stride=(1, 2, 3)), "pair"),
])
def test_module_bad_arguments(kw, needle):
    import gradcore.module as M
    args = dict(in_channels=4, out_channels=6, kernel_size=3)
    args.update(kw)
    with pytest.raises(ValueError, match=needle):
        M.ConvTranspose2d(**args)
