"""conv2d, max_pool2d and avg_pool2d (NCHW): values and gradients against
PyTorch over a table of shapes, strides, paddings, dilations and groups;
first and second order gradients against finite differences; bad input;
dtypes; a small conv net that trains; every CUDA source compiles with nvcc."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.core import TensorDesc, make_backward_graph
from gradcore.ops import (AvgPool2d, AvgPool2dBackward, Convolution, ConvolutionBackwardData,
                          ConvolutionBackwardFilter, MaxPool2d, MaxPool2dBackward, MaxPool2dGather)

TOL = dict(rtol=1e-10, atol=1e-12)

# x shape, weight shape, stride, padding, dilation, groups
CONV = [
    ((2, 3, 7, 7), (4, 3, 3, 3), 1, 0, 1, 1),
    ((1, 3, 8, 8), (5, 3, 3, 3), 2, 1, 1, 1),                      # batch 1
    ((2, 4, 9, 7), (6, 2, 3, 2), (2, 1), (1, 2), (1, 2), 2),        # everything asymmetric, grouped
    ((2, 6, 5, 5), (6, 1, 3, 3), 1, 1, 1, 6),                       # depthwise
    ((3, 4, 5, 6), (8, 4, 1, 1), 1, 0, 1, 1),                       # 1x1
    ((1, 2, 6, 5), (3, 2, 1, 1), 2, 0, 1, 1),                       # 1x1, strided, batch 1
    ((2, 3, 10, 9), (2, 3, 3, 3), 3, 2, 2, 1),                      # dilated
    ((2, 2, 5, 5), (3, 2, 5, 5), 1, 0, 1, 1),                       # kernel covers the input
    ((2, 3, 6, 5), (4, 3, 2, 3), (3, 2), 0, 1, 1),                  # stride leaves rows unused
    ((1, 4, 4, 4), (4, 2, 3, 3), 1, 1, 1, 2),                       # batch 1, grouped, "same"
]
CONV_PARAMS = [pytest.param(*c, id=f"x{list(c[0])}-w{list(c[1])}-s{c[2]}-p{c[3]}-d{c[4]}-g{c[5]}".replace(" ", ""))
               for c in CONV]

# x shape, kernel, stride, padding
POOL = [
    ((2, 3, 6, 6), 2, None, 0),
    ((1, 2, 7, 7), 3, 2, 1),
    ((2, 2, 5, 8), (2, 3), (1, 2), (1, 1)),
    ((2, 1, 5, 5), 3, 1, 1),
    ((1, 1, 4, 4), 1, 1, 0),                                         # 1x1
    ((2, 2, 7, 5), (3, 2), 2, (0, 1)),
    ((1, 3, 5, 5), 5, 1, 2),                                         # windows mostly padding
]
POOL_PARAMS = [pytest.param(*c, id=f"x{list(c[0])}-k{c[1]}-s{c[2]}-p{c[3]}".replace(" ", "")) for c in POOL]


def tnn(torch):
    return torch.nn.functional


def _tp(v):
    return tuple(v) if isinstance(v, (tuple, list)) else v


# ---------------------------------------------------------------- values and gradients vs torch
@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_PARAMS)
def test_conv2d_vs_torch(xs, ws, stride, padding, dilation, groups, rng, h, torch):
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    gfn = lambda x, w: F.conv2d(x, w, None, stride, padding, dilation, groups)
    tfn = lambda x, w: tnn(torch).conv2d(x, w, None, _tp(stride), _tp(padding), _tp(dilation), groups)
    h.compare(torch, gfn, tfn, [x, w], **TOL)


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_PARAMS[:4])
def test_conv2d_with_bias_vs_torch(xs, ws, stride, padding, dilation, groups, rng, h, torch):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal((1, ws[0], 1, 1))
    gfn = lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups)
    tfn = lambda x, w, b: tnn(torch).conv2d(x, w, b.reshape(-1), _tp(stride), _tp(padding), _tp(dilation), groups)
    h.compare(torch, gfn, tfn, [x, w, b], **TOL)


def test_conv2d_accepts_megengine_grouped_5d_weight(rng, h, torch):
    x, w = rng.standard_normal((2, 4, 5, 5)), rng.standard_normal((2, 3, 2, 3, 3))
    gfn = lambda x, w: F.conv2d(x, w, padding=1, groups=2)
    tfn = lambda x, w: tnn(torch).conv2d(x, w.reshape(6, 2, 3, 3), padding=1, groups=2)
    h.compare(torch, gfn, tfn, [x, w], **TOL)


@pytest.mark.parametrize("xs, k, stride, padding", POOL_PARAMS)
def test_max_pool2d_vs_torch(xs, k, stride, padding, rng, h, torch):
    x = rng.standard_normal(xs)
    gfn = lambda x: F.max_pool2d(x, k, stride, padding)
    tfn = lambda x: tnn(torch).max_pool2d(x, _tp(k), _tp(stride), _tp(padding))
    h.compare(torch, gfn, tfn, [x], **TOL)


@pytest.mark.parametrize("mode", ["average_count_exclude_padding", "average"])
@pytest.mark.parametrize("xs, k, stride, padding", POOL_PARAMS)
def test_avg_pool2d_vs_torch(xs, k, stride, padding, mode, rng, h, torch):
    x = rng.standard_normal(xs)
    gfn = lambda x: F.avg_pool2d(x, k, stride, padding, mode)
    tfn = lambda x: tnn(torch).avg_pool2d(x, _tp(k), _tp(stride), _tp(padding),
                                          count_include_pad=(mode == "average"))
    h.compare(torch, gfn, tfn, [x], **TOL)


def test_default_avg_mode_excludes_padding(h):
    x = gradcore.Tensor(np.ones((1, 1, 3, 3)))
    h.assert_close(F.avg_pool2d(x, 3, 1, 1).numpy(), np.ones((1, 1, 3, 3)))
    h.assert_close(F.avg_pool2d(x, 3, 1, 1, mode="average").numpy()[0, 0, 0, 0], 4 / 9)


def test_max_pool2d_gradient_goes_to_the_first_maximum(h, torch):
    x = np.array([[[[1.0, 3.0, 3.0], [0.0, 3.0, 2.0], [1.0, 1.0, 1.0]]]])
    h.compare(torch, lambda t: F.max_pool2d(t, 2, 1), lambda t: tnn(torch).max_pool2d(t, 2, 1), [x], **TOL)


# ---------------------------------------------------------------- finite differences, both orders
GRAD_CONV = [
    ((1, 2, 4, 4), (2, 1, 2, 2), 1, 1, 1, 2),
    ((2, 2, 5, 4), (3, 2, 3, 2), 2, (1, 0), (1, 2), 1),
    ((1, 3, 3, 3), (2, 3, 1, 1), 1, 0, 1, 1),
]


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", GRAD_CONV)
def test_conv2d_grads_finite_differences(xs, ws, stride, padding, dilation, groups, rng, h):
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal((1, ws[0], 1, 1))
    h.check_grads(lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups), [x, w, b])


def test_conv2d_second_order_of_a_nonlinear_function(rng, h):
    # squares make the second derivative depend on x and w together
    x, w = rng.standard_normal((1, 2, 4, 3)), rng.standard_normal((2, 2, 2, 2))
    h.check_grads(lambda x, w: F.conv2d(x * x, w, stride=1, padding=1) * F.conv2d(x, w * w, padding=1), [x, w])


@pytest.mark.parametrize("xs, k, stride, padding", [((1, 2, 4, 4), 2, 2, 0), ((2, 1, 5, 4), 3, (2, 1), 1)])
def test_pool_grads_finite_differences(xs, k, stride, padding, rng, h):
    x = rng.standard_normal(xs)
    h.check_grads(lambda t: F.max_pool2d(t, k, stride, padding), [x])
    h.check_grads(lambda t: F.avg_pool2d(t, k, stride, padding), [x])
    h.check_grads(lambda t: F.avg_pool2d(t, k, stride, padding, mode="average"), [x])
    # second order through a nonlinearity before and after the pooling
    h.check_grads(lambda t: F.max_pool2d(F.tanh(t), k, stride, padding) ** 2, [x])
    h.check_grads(lambda t: F.avg_pool2d(F.tanh(t), k, stride, padding) ** 2, [x])


def test_conv2d_double_backward_vs_torch(rng, h, torch):
    """d/d(x, w) sum(v * d/dx sum(u * conv(x, w)^2)) against torch's double backward."""
    x, w = rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((4, 1, 3, 3))
    u, v = rng.standard_normal((2, 4, 3, 3)), rng.standard_normal((2, 2, 5, 5))
    kw = dict(stride=2, padding=1, dilation=1, groups=2)

    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    (gt,) = torch.autograd.grad((tnn(torch).conv2d(xt, wt, **kw) ** 2 * torch.tensor(u)).sum(), xt,
                                create_graph=True)
    gxt, gwt = torch.autograd.grad((gt * torch.tensor(v)).sum(), [xt, wt])

    xg, wg = gradcore.Tensor(x), gradcore.Tensor(w)
    outer = gradcore.GradManager().attach([xg, wg])
    with outer:
        inner = gradcore.GradManager().attach([xg])
        with inner:
            inner.backward(F.sum(F.conv2d(xg, wg, **kw) ** 2 * gradcore.Tensor(u)))
        g = xg.grad
        xg.grad = None
        outer.backward(F.sum(g * gradcore.Tensor(v)))
    h.assert_close(xg.grad.numpy(), gxt.numpy(), **TOL, what="d2/dx2")
    h.assert_close(wg.grad.numpy(), gwt.numpy(), **TOL, what="d2/dxdw")


# ---------------------------------------------------------------- backward graphs
def test_conv2d_backward_saves_only_what_it_reads():
    x, w = TensorDesc((2, 3, 5, 5), "float32", "cpu"), TensorDesc((4, 3, 3, 3), "float32", "cpu")
    op = Convolution(1, 0, 1, 1)
    _, mask, has = make_backward_graph(op, [x, w], [True, False], [True])
    assert has == [True, False] and mask == [False, True, False, True]   # w and dy; x only by shape
    _, mask, _ = make_backward_graph(op, [x, w], [False, True], [True])
    assert mask == [True, False, False, True]
    _, mask, _ = make_backward_graph(AvgPool2d(2), [x], [True], [True])
    assert mask == [False, False, True]                                    # avg pool needs only dy


def test_ops_are_registered():
    from gradcore.ops import get
    for cls in (Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter, MaxPool2d, MaxPool2dBackward,
                MaxPool2dGather, AvgPool2d, AvgPool2dBackward):
        assert get(cls.__name__) is cls
    assert F.nn.conv2d is F.conv2d and F.nn.max_pool2d is F.max_pool2d and F.nn.avg_pool2d is F.avg_pool2d


# ---------------------------------------------------------------- errors
def _x(shape, dtype="float32"):
    return gradcore.Tensor(np.ones(shape, dtype))


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("xs, ws, kw, needles", [
    ((2, 3, 5, 5), (4, 2, 3, 3), {}, ["channel", "3", "2"]),
    ((1, 1, 3, 3), (1, 1, 5, 5), {}, ["larger", "5", "3"]),
    ((1, 1, 4, 4), (1, 1, 3, 3), dict(padding=1, dilation=3), ["larger", "dilation"]),
    ((1, 4, 5, 5), (6, 2, 3, 3), dict(groups=3), ["divisible", "groups=3"]),
    ((1, 4, 5, 5), (5, 2, 3, 3), dict(groups=2), ["output channels 5", "groups=2"]),
    ((3, 5, 5), (4, 3, 3, 3), {}, ["4-D"]),
    ((1, 3, 5, 5), (4, 3, 3), {}, ["weight", "4-D"]),
])
def test_conv2d_bad_input(xs, ws, kw, needles, record, h):
    w = _x(ws)
    ei = h.error_of(lambda x: F.conv2d(x, w, **kw), _x(xs), record)
    h.check_error(ei, "Conv2d", str(tuple(xs)), str(tuple(ws)), *needles)


def test_conv2d_dtypes():
    # a float32 input with a float64 weight is promoted (tests/test_dtype_rules.py
    # checks values and gradients); integer input and weight have no float to
    # promote to: an error naming the op and the dtypes
    assert F.conv2d(_x((1, 3, 5, 5)), _x((2, 3, 3, 3), "float64")).dtype == np.float64
    ints = gradcore.Tensor(np.ones((2, 3, 3, 3), "int32"))
    with pytest.raises(ValueError, match=r"conv2d.*Convolution.*int32"):
        F.conv2d(gradcore.Tensor(np.ones((1, 3, 5, 5), "int32")), ints)


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("fn, needles", [
    (lambda x: F.max_pool2d(x, 3), ["MaxPool2d", "larger", "(1, 1, 2, 2)"]),
    (lambda x: F.avg_pool2d(x, 3), ["AvgPool2d", "larger", "(1, 1, 2, 2)"]),
    (lambda x: F.max_pool2d(x, 2, 1, 2), ["MaxPool2d", "padding 2", "(1, 1, 2, 2)"]),
    (lambda x: F.avg_pool2d(F.reshape(x, (1, 2, 2)), 1), ["AvgPool2d", "4-D", "(1, 2, 2)"]),
])
def test_pool_bad_input(fn, needles, record, h):
    ei = h.error_of(fn, _x((1, 1, 2, 2)), record)
    h.check_error(ei, *needles)


def test_bad_attributes_name_the_op():
    with pytest.raises(ValueError, match="conv2d: stride"):
        F.conv2d(_x((1, 1, 3, 3)), _x((1, 1, 1, 1)), stride=0)
    with pytest.raises(ValueError, match="conv2d: groups"):
        F.conv2d(_x((1, 1, 3, 3)), _x((1, 1, 1, 1)), groups=0)
    with pytest.raises(ValueError, match="Convolution: groups"):
        Convolution(1, 0, 1, 0)
    with pytest.raises(ValueError, match="Convolution: stride .* padding .* different numbers of spatial axes"):
        Convolution((1, 1), (0, 0, 0))
    with pytest.raises(ValueError, match="AvgPool2d: mode"):
        F.avg_pool2d(_x((1, 1, 3, 3)), 2, mode="median")
    with pytest.raises(ValueError, match="MaxPool2d: kernel_size"):
        F.max_pool2d(_x((1, 1, 3, 3)), (1, 2, 3))


# ---------------------------------------------------------------- dtypes
def test_float32_stays_float32(rng, h, torch):
    x, w = rng.standard_normal((2, 4, 6, 6)), rng.standard_normal((4, 2, 3, 3))
    for fn, tfn, ins in [
        (lambda x, w: F.conv2d(x, w, padding=1, groups=2),
         lambda x, w: tnn(torch).conv2d(x, w, padding=1, groups=2), [x, w]),
        (lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: tnn(torch).max_pool2d(x, 3, 2, 1), [x]),
        (lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: tnn(torch).avg_pool2d(x, 3, 2, 1, count_include_pad=False), [x]),
    ]:
        ins32 = [a.astype(np.float32) for a in ins]
        out, grads, wt = h.gc_vjp(fn, ins32)
        assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
        t_out, t_grads = h.torch_vjp(torch, tfn, ins, wt.astype(np.float64))   # float64 reference
        h.assert_close(out, t_out, rtol=1e-4, atol=1e-4, what="value")
        for g, tg in zip(grads, t_grads):
            h.assert_close(g, tg, rtol=1e-4, atol=1e-4, what="grad")


# ---------------------------------------------------------------- modules
def test_modules_shapes_and_parameters():
    conv = M.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    # MegEngine's grouped weight: (groups, out/groups, in/groups, kh, kw)
    assert conv.weight.shape == (2, 3, 2, 3, 3) and conv.bias.shape == (1, 6, 1, 1)
    assert conv.weight.dtype == np.float32
    x = _x((2, 4, 7, 7))
    assert conv(x).shape == (2, 6, 4, 4)
    assert M.Conv2d(4, 6, (1, 2), bias=False).bias is None
    assert M.MaxPool2d(2)(x).shape == (2, 4, 3, 3)
    assert M.AvgPool2d(3, 1, 1)(x).shape == (2, 4, 7, 7)
    assert M.Flatten()(x).shape == (2, 196)
    assert [n for n, _ in M.Sequential(conv, M.Flatten()).named_parameters()] == \
        ["0.bias", "0.weight"]          # MegEngine's sorted order


def test_small_conv_net_trains():
    gradcore.random.seed(0)
    rng = np.random.default_rng(0)
    x = gradcore.Tensor(rng.standard_normal((16, 1, 8, 8)).astype("float32"))
    y = gradcore.Tensor(rng.integers(0, 3, 16).astype("int32"))
    net = M.Sequential(M.Conv2d(1, 4, 3, padding=1), M.ReLU(), M.MaxPool2d(2), M.Flatten(), M.Linear(64, 3))
    params = list(net.parameters())
    assert len(params) == 4
    gm = gradcore.GradManager().attach(params)
    opt = optim.SGD(params, lr=0.1)
    losses = []
    for _ in range(6):
        with gm:
            loss = F.cross_entropy(net(x), y)
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(float(loss.item()))
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses


# ---------------------------------------------------------------- CUDA sources
# (what each kernel computes is tested through its launcher on the emulator, tests/cuda/test_cuda_conv.py)
CONV_ATTRS = ((2, 1), (1, 2), (1, 2), 2)
POOL_ATTRS = ((3, 2), (2, 1), (1, 1))
ALL_OPS = [Convolution(*CONV_ATTRS), ConvolutionBackwardData(*CONV_ATTRS), ConvolutionBackwardFilter(*CONV_ATTRS),
           MaxPool2d(*POOL_ATTRS), MaxPool2dBackward(*POOL_ATTRS), MaxPool2dGather(*POOL_ATTRS),
           AvgPool2d(*POOL_ATTRS), AvgPool2dBackward(*POOL_ATTRS, "average")]


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_cuda_sources_compile(nvcc_ptx, ctype):
    # one translation unit for every op (kernel names differ): one nvcc run
    ptx = nvcc_ptx("\n".join(op.cuda_source(ctype) for op in ALL_OPS), f"conv_{ctype}")
    for name in ("conv", "conv_backward_data", "conv_backward_filter", "max_pool2d",
                 "max_pool2d_backward", "max_pool2d_gather", "avg_pool2d", "avg_pool2d_backward"):
        assert f"gc_{name}_{ctype}" in ptx


def test_avg_pool2d_mode_in_either_case(rng, h, torch):
    x = rng.standard_normal((1, 2, 5, 5))
    for mode, include in [("AVERAGE", True), ("AVERAGE_COUNT_EXCLUDE_PADDING", False)]:
        h.compare(torch, lambda t: F.avg_pool2d(t, 3, 2, 1, mode=mode),
                  lambda t: torch.nn.functional.avg_pool2d(t, 3, 2, 1, count_include_pad=include), [x])


def test_conv2d_vector_bias_is_per_output_channel(rng, h, torch):
    # (O,) as PyTorch's bias: one per channel, even where OW == O would broadcast it per column
    x, w, b = rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3)
    h.compare(torch, lambda *t: F.conv2d(*t), lambda *t: torch.nn.functional.conv2d(*t), [x, w, b])
