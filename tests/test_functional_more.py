"""More of MegEngine's functional API as composites of gradcore ops:
layer_norm, group_norm, pad, adaptive_avg_pool2d, adaptive_max_pool2d,
conv1d, pixel_shuffle, topk_accuracy, argsort, diag, logaddexp, atan2,
meshgrid, cond_take and swapaxes.

Values and first-order gradients against PyTorch (NumPy where torch has no
counterpart), first and second order against float64 finite differences,
and second order against torch's autograd for the smooth ones.
"""
from __future__ import annotations

import doctest
import inspect

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager
from oracle import check_grads64 as check_grads, compare_second_order, compare_torch, gc_vjp

# a kernel computing 0/0, exp overflow, log(0)... is a bug here
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

INF = float("inf")


# ---------------------------------------------------------------- helpers
def tnn(torch):
    return torch.nn.functional


# ---------------------------------------------------------------- layer_norm
LN_CASES = [((4, 5), 5), ((2, 3, 4), (3, 4)), ((2, 3, 4), [4]), ((6,), 6), ((2, 1, 3), (1, 3)),
            ((3, 2, 2, 2), (2, 2, 2))]
LN_IDS = [f"{list(s)}-{n}".replace(" ", "") for s, n in LN_CASES]


@pytest.mark.parametrize("shape, nshape", LN_CASES, ids=LN_IDS)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_vs_torch(shape, nshape, affine, rng, torch):
    tshape = (nshape,) if isinstance(nshape, int) else tuple(nshape)
    x = rng.standard_normal(shape) * 3 + 1
    if affine:
        w, b = rng.standard_normal(tshape), rng.standard_normal(tshape)
        compare_torch(torch, lambda x, w, b: F.nn.layer_norm(x, nshape, True, w, b),
                      lambda x, w, b: tnn(torch).layer_norm(x, tshape, w, b), [x, w, b], rtol=1e-9, atol=1e-11)
    else:
        compare_torch(torch, lambda x: F.nn.layer_norm(x, nshape, affine=False),
                      lambda x: tnn(torch).layer_norm(x, tshape), [x], rtol=1e-9, atol=1e-11)


def test_layer_norm_grads_and_second_order(rng, torch):
    x, w, b = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(4)
    fn = lambda x, w, b: F.nn.layer_norm(x, 4, True, w, b, eps=1e-3)
    check_grads(fn, [x, w, b])
    compare_second_order(torch, fn, lambda x, w, b: tnn(torch).layer_norm(x, (4,), w, b, eps=1e-3),
                         [x, w, b], rng, rtol=1e-8, atol=1e-10)


def test_layer_norm_eps_and_constant_rows(torch):
    """A constant row normalises to 0 with a finite gradient (var + eps > 0)."""
    x = np.array([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]])
    compare_torch(torch, lambda x: F.nn.layer_norm(x, 3, False, eps=0.1),
                  lambda x: tnn(torch).layer_norm(x, (3,), eps=0.1), [x])


def test_layer_norm_megengine_calls():
    """MegEngine's positional order (inp, normalized_shape, affine, weight,
    bias, eps), F.layer_norm at top level, float32 kept, a flat weight."""
    x = np.random.default_rng(0).standard_normal((2, 2, 3)).astype(np.float32)
    w, b = np.full((2, 3), 2.0, np.float32), np.full((2, 3), 0.5, np.float32)
    out = F.nn.layer_norm(gc.Tensor(x), (2, 3), True, gc.Tensor(w), gc.Tensor(b), 1e-5)
    assert F.layer_norm is F.nn.layer_norm and out.dtype == np.float32
    ref = (x - x.mean((1, 2), keepdims=True)) / np.sqrt(x.var((1, 2), keepdims=True) + 1e-5) * 2 + 0.5
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    flat = F.nn.layer_norm(gc.Tensor(x), (2, 3), True, gc.Tensor(w.reshape(-1)), gc.Tensor(b.reshape(-1)))
    np.testing.assert_allclose(flat.numpy(), out.numpy())
    params = inspect.signature(F.nn.layer_norm).parameters
    assert list(params) == ["inp", "normalized_shape", "affine", "weight", "bias", "eps"]
    assert params["affine"].default is True and params["eps"].default == 1e-5


@pytest.mark.parametrize("kwargs, exc, needle", [
    (dict(normalized_shape=5), ValueError, "trailing"),
    (dict(normalized_shape=(2, 4)), ValueError, "trailing"),
    (dict(normalized_shape=(1, 3, 4)), ValueError, "trailing"),
    (dict(normalized_shape=()), ValueError, "trailing"),
    (dict(normalized_shape=4.0), TypeError, "normalized_shape"),
    (dict(normalized_shape=4, affine=True), ValueError, "weight"),
    (dict(normalized_shape=4, affine=True, weight=np.ones(3), bias=np.zeros(4)), ValueError, "(4,)"),
])
def test_layer_norm_bad_arguments(kwargs, exc, needle):
    with pytest.raises(exc, match="layer_norm") as ei:
        F.nn.layer_norm(gc.Tensor(np.zeros((2, 3, 4))), **kwargs)
    assert needle in str(ei.value)


# ---------------------------------------------------------------- group_norm
@pytest.mark.parametrize("shape, groups", [((2, 6, 3, 2), 3), ((2, 4, 5), 2), ((3, 4), 4), ((1, 6, 2, 2), 1)])
def test_group_norm_vs_torch(shape, groups, rng, torch):
    x, w, b = rng.standard_normal(shape) * 2, rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    compare_torch(torch, lambda x, w, b: F.nn.group_norm(x, groups, True, w, b),
                  lambda x, w, b: tnn(torch).group_norm(x, groups, w, b), [x, w, b], rtol=1e-9, atol=1e-11)
    compare_torch(torch, lambda x: F.nn.group_norm(x, groups, False),
                  lambda x: tnn(torch).group_norm(x, groups), [x], rtol=1e-9, atol=1e-11)


def test_group_norm_second_order(rng, torch):
    x, w, b = rng.standard_normal((2, 4, 3)), rng.standard_normal(4), rng.standard_normal(4)
    fn = lambda x, w, b: F.nn.group_norm(x, 2, True, w, b, 1e-3)
    check_grads(fn, [x, w, b])
    compare_second_order(torch, fn, lambda x, w, b: tnn(torch).group_norm(x, 2, w, b, 1e-3), [x, w, b], rng,
                         rtol=1e-8, atol=1e-10)


def test_group_norm_bad_arguments():
    with pytest.raises(ValueError, match=r"group_norm.*divisible.*\(2, 6, 3\)"):
        F.nn.group_norm(gc.Tensor(np.zeros((2, 6, 3))), 4, False)
    with pytest.raises(ValueError, match="group_norm.*weight"):
        F.nn.group_norm(gc.Tensor(np.zeros((2, 6, 3))), 3, True)
    with pytest.raises(ValueError, match="group_norm"):
        F.nn.group_norm(gc.Tensor(np.zeros(6)), 3, False)


# ---------------------------------------------------------------- pad
def _torch_pad(pad_width):
    """MegEngine's leading-axes pairs as torch's flat last-axis-first tuple."""
    return tuple(v for pair in reversed(pad_width) for v in pair)


NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "edge": "edge"}


@pytest.mark.parametrize("shape, pad_width", [
    ((3,), ((1, 2),)),
    ((2, 3), ((1, 1),)),
    ((2, 3), ((0, 2), (3, 1))),
    ((2, 3, 4), ((1, 0), (0, 0), (2, 2))),
    ((1, 2, 2, 3), ((0, 0), (1, 1), (0, 3), (2, 0))),
    ((2, 0, 3), ((0, 0), (1, 2), (1, 0))),
])
@pytest.mark.parametrize("value", [0.0, -2.5])
def test_pad_constant_vs_torch_and_numpy(shape, pad_width, value, rng, torch):
    x = rng.standard_normal(shape)
    full = tuple(pad_width) + ((0, 0),) * (len(shape) - len(pad_width))
    fn = lambda x: F.nn.pad(x, pad_width, constant_value=value)
    np.testing.assert_array_equal(fn(gc.Tensor(x)).numpy(), np.pad(x, full, constant_values=value))
    compare_torch(torch, fn, lambda t: tnn(torch).pad(t, _torch_pad(full), value=value), [x])


@pytest.mark.parametrize("mode", ["reflect", "replicate", "edge", "REFLECT"])
@pytest.mark.parametrize("pad_width", [((0, 0), (0, 0), (1, 2), (2, 1)), ((0, 0), (0, 0), (0, 0), (3, 0)),
                                       ((0, 0), (0, 0), (2, 0))])
def test_pad_reflect_replicate_vs_torch(mode, pad_width, rng, torch):
    x = rng.standard_normal((2, 3, 4, 5))
    tmode = "reflect" if mode.lower() == "reflect" else "replicate"
    full = tuple(pad_width) + ((0, 0),) * (4 - len(pad_width))
    fn = lambda x: F.nn.pad(x, pad_width, mode=mode)
    np.testing.assert_array_equal(fn(gc.Tensor(x)).numpy(), np.pad(x, full, NP_MODE[mode.lower()]))
    compare_torch(torch, fn, lambda t: tnn(torch).pad(t, _torch_pad(full[2:]), mode=tmode), [x])


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape, pad_width", [
    ((4,), ((7, 9),)),                 # wider than the axis: np.pad's repeated reflection
    ((2, 3), ((2, 2), (5, 4))),        # every axis
    ((1, 3), ((3, 2), (1, 1))),        # an axis of size 1
    ((2, 2), ((0, 3), (3, 0))),
])
def test_pad_wide_and_every_axis_vs_numpy(mode, shape, pad_width, rng):
    x = rng.standard_normal(shape)
    fn = lambda x: F.nn.pad(x, pad_width, mode)
    np.testing.assert_array_equal(fn(gc.Tensor(x)).numpy(), np.pad(x, pad_width, NP_MODE[mode]))
    check_grads(fn, [x], second=False)
    # the gradient sums what each source element was copied to
    _, (g,), w = gc_vjp(fn, [x])
    idx = np.pad(np.arange(x.size).reshape(shape), pad_width, NP_MODE[mode])
    np.testing.assert_allclose(g.reshape(-1), np.bincount(idx.reshape(-1), w.reshape(-1), x.size))


def test_pad_megengine_examples_and_dtypes():
    inp = gc.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(F.nn.pad(inp, ((1, 1),)).numpy(), [[0, 0, 0], [1, 2, 3], [4, 5, 6], [0, 0, 0]])
    np.testing.assert_array_equal(F.nn.pad(inp, ((1, 1),), constant_value=9).numpy()[0], [9, 9, 9])
    np.testing.assert_array_equal(F.nn.pad(inp, ((1, 1), (1, 2)), mode="reflect").numpy(),
                                  [[5, 4, 5, 6, 5, 4], [2, 1, 2, 3, 2, 1]] * 2)
    np.testing.assert_array_equal(F.nn.pad(inp, ((1, 1), (1, 2)), mode="replicate").numpy(),
                                  [[1, 1, 2, 3, 3, 3], [1, 1, 2, 3, 3, 3], [4, 4, 5, 6, 6, 6], [4, 4, 5, 6, 6, 6]])
    ints = F.nn.pad(gc.tensor([1, 2]), ((1, 0),), constant_value=7)
    assert ints.dtype == np.int32 and ints.numpy().tolist() == [7, 1, 2]
    assert F.pad(inp, ((0, 0), (0, 0))).dtype == np.float32


def test_pad_second_order_runs(rng):
    """pad is linear: its second-order term is zero, computed through a
    nonlinearity both ways."""
    for mode in ("constant", "reflect", "replicate"):
        check_grads(lambda x: F.sin(F.nn.pad(x, ((1, 2), (2, 1)), mode)), [rng.standard_normal((3, 4))])


@pytest.mark.parametrize("args, exc, needle", [
    ((((1, 1),), "circular"), ValueError, "mode"),
    ((((1, 1), (1, 1), (1, 1)),), ValueError, "3 pairs"),
    ((((1, -1),),), ValueError, ">= 0"),
    (((1, 1),), TypeError, "pairs"),
    ((((1, 2, 3),),), ValueError, "pairs"),
    ((((1.5, 1),),), TypeError, "pad_width"),
])
def test_pad_bad_arguments(args, exc, needle):
    with pytest.raises(exc, match="pad") as ei:
        F.nn.pad(gc.Tensor(np.zeros((2, 3))), *args)
    assert needle in str(ei.value)


def test_pad_reflect_of_empty_axis_is_an_error():
    with pytest.raises(ValueError, match=r"pad: cannot reflect-pad axis 1 of size 0"):
        F.nn.pad(gc.Tensor(np.zeros((2, 0))), ((0, 0), (1, 1)), "reflect")


# ---------------------------------------------------------------- adaptive pooling
POOLS = {"avg": (F.nn.adaptive_avg_pool2d, "adaptive_avg_pool2d", "avg_pool2d"),
         "max": (F.nn.adaptive_max_pool2d, "adaptive_max_pool2d", "max_pool2d")}


@pytest.mark.parametrize("kind", list(POOLS))
@pytest.mark.parametrize("shape, oshp", [((2, 3, 8, 6), (4, 3)), ((1, 2, 6, 6), 3), ((2, 1, 5, 7), 1),
                                         ((1, 1, 4, 6), (4, 6)), ((1, 2, 6, 4), [2, 1])])
def test_adaptive_pool_vs_torch_divisible(kind, shape, oshp, rng, torch):
    """Where the output size divides the input's, MegEngine's windows are
    PyTorch's bins."""
    fn, tname, _ = POOLS[kind]
    x = rng.standard_normal(shape)
    tos = tuple(oshp) if isinstance(oshp, (tuple, list)) else oshp
    compare_torch(torch, lambda x: fn(x, oshp), lambda t: getattr(tnn(torch), tname)(t, tos), [x])


@pytest.mark.parametrize("kind", list(POOLS))
@pytest.mark.parametrize("shape, oshp, window, stride", [
    ((1, 2, 5, 7), (3, 2), (3, 4), (1, 3)),
    ((2, 1, 7, 7), 3, (3, 3), (2, 2)),
    ((1, 1, 9, 4), (4, 3), (3, 2), (2, 1)),
])
def test_adaptive_pool_megengine_windows(kind, shape, oshp, window, stride, rng, torch):
    """Otherwise MegEngine's: stride ``in // out``, window ``in - (out - 1) *
    stride`` (not PyTorch's uneven bins)."""
    fn, _, tname = POOLS[kind]
    x = rng.standard_normal(shape)
    out = fn(gc.Tensor(x), oshp)
    assert out.shape[2:] == ((oshp,) * 2 if isinstance(oshp, int) else oshp)
    compare_torch(torch, lambda x: fn(x, oshp), lambda t: getattr(tnn(torch), tname)(t, window, stride), [x])


def test_adaptive_pool_grads_and_oshp_forms(rng):
    x = rng.standard_normal((2, 2, 5, 6))
    check_grads(lambda x: F.nn.adaptive_avg_pool2d(x, (2, 3)), [x])
    check_grads(lambda x: F.nn.adaptive_max_pool2d(x, (2, 4)), [x], second=False)
    a = F.nn.adaptive_avg_pool2d(gc.Tensor(x), gc.tensor([2, 3])).numpy()
    np.testing.assert_array_equal(a, F.adaptive_avg_pool2d(gc.Tensor(x), (2, 3)).numpy())


@pytest.mark.parametrize("kind", list(POOLS))
@pytest.mark.parametrize("shape, oshp", [((2, 3, 4), 2), ((1, 1, 4, 4), 5), ((1, 1, 4, 4), (2, 0)),
                                         ((1, 1, 4, 4), (1, 2, 3)), ((1, 1, 4, 4), 2.0)])
def test_adaptive_pool_bad_arguments(kind, shape, oshp):
    fn, name, _ = POOLS[kind]
    with pytest.raises((ValueError, TypeError), match=name):
        fn(gc.Tensor(np.zeros(shape)), oshp)


# ---------------------------------------------------------------- conv1d
@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1),
                                                               (3, 1, 2, 2), (1, 0, 1, 4)])
def test_conv1d_vs_torch(stride, padding, dilation, groups, rng, torch):
    x, w, b = rng.standard_normal((2, 4, 11)), rng.standard_normal((8, 4 // groups, 3)), rng.standard_normal(8)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    compare_torch(torch, lambda x, w, b: F.nn.conv1d(x, w, b, **kw), lambda x, w, b: tnn(torch).conv1d(x, w, b, **kw),
                  [x, w, b], rtol=1e-9, atol=1e-11)
    compare_torch(torch, lambda x, w, b: F.nn.conv1d(x, w, F.reshape(b, (1, 8, 1)), **kw),
                  lambda x, w, b: tnn(torch).conv1d(x, w, b, **kw), [x, w, b], rtol=1e-9, atol=1e-11)


def test_conv1d_grouped_weight_and_second_order(rng, torch):
    x, w = rng.standard_normal((2, 4, 7)), rng.standard_normal((2, 3, 2, 3))
    compare_torch(torch, lambda x, w: F.conv1d(x, w, groups=2, padding=1),
                  lambda x, w: tnn(torch).conv1d(x, w.reshape(6, 2, 3), groups=2, padding=1), [x, w], rtol=1e-9)
    fn = lambda x, w: F.nn.conv1d(x, w, stride=(2,), padding=1)
    check_grads(fn, [rng.standard_normal((1, 2, 6)), rng.standard_normal((3, 2, 2))])
    compare_second_order(torch, lambda x, w: F.tanh(fn(x, w)),
                         lambda x, w: torch.tanh(tnn(torch).conv1d(x, w, stride=2, padding=1)),
                         [rng.standard_normal((1, 2, 6)), rng.standard_normal((3, 2, 2))], rng)


@pytest.mark.parametrize("xs, ws, kwargs, needle", [
    ((2, 4, 5, 1), (3, 4, 2), {}, "input must be 3-D (N, C, L)"),
    ((2, 4, 5), (3, 4), {}, "weight must be"),
    ((2, 4, 5), (3, 4, 2), dict(stride=0), "stride"),
    ((2, 4, 5), (3, 4, 2), dict(padding=(1, 1)), "padding"),
])
def test_conv1d_bad_arguments(xs, ws, kwargs, needle):
    with pytest.raises(ValueError, match="conv1d") as ei:
        F.nn.conv1d(gc.Tensor(np.zeros(xs)), gc.Tensor(np.zeros(ws)), **kwargs)
    assert needle in str(ei.value)


# ---------------------------------------------------------------- pixel_shuffle
@pytest.mark.parametrize("shape, r", [((1, 4, 2, 3), 2), ((2, 18, 1, 2), 3), ((3, 8, 2, 2), 2), ((2, 5, 3, 2), 1),
                                      ((2, 3, 8, 2, 1), 2)])
def test_pixel_shuffle_vs_torch(shape, r, rng, torch):
    compare_torch(torch, lambda x: F.nn.pixel_shuffle(x, r), lambda t: tnn(torch).pixel_shuffle(t, r),
                  [rng.standard_normal(shape)])


def test_pixel_shuffle_bad_arguments():
    with pytest.raises(ValueError, match=r"pixel_shuffle.*\(1, 6, 2, 2\)"):
        F.nn.pixel_shuffle(gc.Tensor(np.zeros((1, 6, 2, 2))), 2)
    with pytest.raises(ValueError, match="pixel_shuffle.*upscale_factor"):
        F.nn.pixel_shuffle(gc.Tensor(np.zeros((1, 4, 2, 2))), 0)


# ---------------------------------------------------------------- topk_accuracy
def test_topk_accuracy(rng):
    logits = rng.standard_normal((20, 6))
    target = rng.integers(0, 6, 20).astype(np.int32)
    rank = (-logits).argsort(1).argsort(1)[np.arange(20), target]
    accs = F.topk_accuracy(gc.Tensor(logits), gc.Tensor(target), (1, 3, 6))
    assert isinstance(accs, list) and len(accs) == 3
    for k, acc in zip((1, 3, 6), accs):
        assert acc.dtype == np.float32 and acc.shape == ()
        np.testing.assert_allclose(acc.item(), np.mean(rank < k), rtol=1e-6)
    one = F.nn.topk_accuracy(gc.Tensor(logits), gc.Tensor(target))
    np.testing.assert_allclose(one.item(), np.mean(rank < 1), rtol=1e-6)
    with pytest.raises(ValueError, match="topk_accuracy"):
        F.topk_accuracy(gc.Tensor(logits), gc.Tensor(target), 7)
    with pytest.raises(ValueError, match="topk_accuracy.*target"):
        F.topk_accuracy(gc.Tensor(logits), gc.Tensor(target[:3]))


# ---------------------------------------------------------------- argsort
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (1,), (0,)])
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_vs_torch(shape, descending, rng, torch):
    x = rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float64)   # no ties
    out = F.argsort(gc.Tensor(x), descending)
    assert out.dtype == np.int32 and out.shape == shape
    np.testing.assert_array_equal(out.numpy(), torch.argsort(torch.tensor(x), descending=descending).numpy())


def test_argsort_megengine_example_and_no_gradient():
    assert F.argsort(gc.tensor(np.array([1, 2], np.float32))).numpy().tolist() == [0, 1]
    x = gc.Tensor(np.array([2.0, 0.0, 1.0]))
    with GradManager().attach([x]) as gm:
        idx = F.argsort(x, descending=True)
        gm.backward(F.sum(F.getitem(x, idx) * gc.Tensor(np.array([1.0, 2.0, 3.0]))))
    assert idx.numpy().tolist() == [0, 2, 1]
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 3.0, 2.0])


# ---------------------------------------------------------------- diag
@pytest.mark.parametrize("shape", [(4,), (3, 3), (3, 5), (5, 2), (1,), (0,)])
@pytest.mark.parametrize("k", [0, 1, -1, 3, -4])
def test_diag_vs_torch(shape, k, rng, torch):
    x = rng.standard_normal(shape)
    compare_torch(torch, lambda x: F.diag(x, k), lambda t: torch.diag(t, k), [x])
    np.testing.assert_array_equal(F.diag(gc.Tensor(x), k=k).numpy(), np.diag(x, k))


def test_diag_megengine_examples_and_grads(rng):
    np.testing.assert_array_equal(F.diag(gc.tensor([1, 2, 3])).numpy(), np.diag([1, 2, 3]))
    assert F.diag(gc.tensor([1, 2, 3])).dtype == np.int32
    x = F.reshape(F.arange(9), (3, 3))
    np.testing.assert_array_equal(F.diag(x).numpy(), [0, 4, 8])
    np.testing.assert_array_equal(F.diag(x, k=1).numpy(), [1, 5])
    np.testing.assert_array_equal(F.diag(x, k=-1).numpy(), [3, 7])
    check_grads(lambda t: F.diag(t, 1) ** 2, [rng.standard_normal((3, 4))])
    check_grads(lambda t: F.diag(t, -2) ** 2, [rng.standard_normal(3)])


def test_diag_bad_arguments():
    with pytest.raises(ValueError, match=r"diag: inp must be 1-d or 2-d, got shape \(2, 2, 2\)"):
        F.diag(gc.Tensor(np.zeros((2, 2, 2))))
    with pytest.raises(TypeError, match="diag: k"):
        F.diag(gc.Tensor(np.zeros(3)), 1.0)


# ---------------------------------------------------------------- logaddexp
@pytest.mark.parametrize("xs, ys", [((3, 4), (3, 4)), ((3, 1), (4,)), ((), (2, 3)), ((5,), ())])
def test_logaddexp_vs_torch(xs, ys, rng, torch):
    x, y = rng.standard_normal(xs) * 5, rng.standard_normal(ys) * 5
    compare_torch(torch, F.logaddexp, torch.logaddexp, [x, y])
    compare_second_order(torch, F.logaddexp, torch.logaddexp, [x, y], rng)
    check_grads(F.logaddexp, [x, y])


def test_logaddexp_extremes_ties_and_dtypes(torch):
    x = np.array([0.0, 1000.0, -1000.0, -INF, INF, INF, -INF, 3.0, -800.0])
    y = np.array([0.0, 1000.0, -1001.0, -INF, INF, -INF, 2.0, -INF, 800.0])
    with np.errstate(divide="ignore"):      # log(0) for -inf and -inf, as F.logsumexp
        out = F.logaddexp(gc.Tensor(x), gc.Tensor(y)).numpy()
    np.testing.assert_allclose(out, np.logaddexp(x, y), rtol=1e-15)
    finite = np.isfinite(x) & np.isfinite(y)
    compare_torch(torch, F.logaddexp, torch.logaddexp, [x[finite], y[finite]])   # ties: half each
    assert F.logaddexp(gc.tensor([1, 2]), gc.tensor([3, 4])).dtype == np.float32
    out = F.logaddexp(gc.Tensor(np.array([1.0], np.float32)), 2.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), np.logaddexp(1.0, 2.0), rtol=1e-6)
    np.testing.assert_allclose(F.logaddexp(F.log(gc.tensor(1e-10)), F.log(gc.tensor(2e-10))).item(),
                               -21.927238, rtol=1e-6)
    with pytest.raises(ValueError, match=r"logaddexp: shapes \(2,\) and \(3,\)"):
        F.logaddexp(gc.Tensor(np.zeros(2)), gc.Tensor(np.zeros(3)))


# ---------------------------------------------------------------- atan2
def test_atan2_vs_torch_every_quadrant(rng, torch):
    angles = np.linspace(-np.pi + 0.05, np.pi - 0.05, 37)
    radii = rng.uniform(0.2, 5.0, 37)
    y, x = radii * np.sin(angles), radii * np.cos(angles)
    compare_torch(torch, F.atan2, torch.atan2, [y, x], rtol=1e-9, atol=1e-12)
    compare_second_order(torch, F.atan2, torch.atan2, [y, x], rng, rtol=1e-8, atol=1e-10)
    check_grads(F.atan2, [y[:8], x[:8]])


def test_atan2_on_the_axes_and_broadcasting(torch):
    y = np.array([0.0, 0.0, 2.0, -2.0, 3.0, -3.0, 1.0])
    x = np.array([1.5, -1.5, 0.0, 0.0, 3.0, -3.0, 1e-30])
    np.testing.assert_allclose(F.atan2(gc.Tensor(y), gc.Tensor(x)).numpy(), np.arctan2(y, x), rtol=1e-15)
    compare_torch(torch, F.atan2, torch.atan2, [y, x], rtol=1e-9)      # gradients finite on the axes
    compare_torch(torch, F.atan2, torch.atan2, [np.array([[1.0], [-2.0]]), np.array([0.5, -0.5, 0.0])])
    assert F.atan2(gc.tensor([0, 1]), gc.tensor([1, 1])).dtype == np.float32
    np.testing.assert_allclose(F.atan2(gc.tensor([0, 1, -1]), gc.tensor([1, 1, 1])).numpy(),
                               [0.0, 0.7854, -0.7854], atol=1e-4)


# ---------------------------------------------------------------- meshgrid
@pytest.mark.parametrize("indexing", ["xy", "ij"])
@pytest.mark.parametrize("lengths", [(3,), (3, 2), (2, 4, 3), (1, 5), (0, 2)])
def test_meshgrid_vs_torch(indexing, lengths, rng, torch):
    arrays = [rng.standard_normal(n) for n in lengths]
    ours = F.meshgrid(*[gc.Tensor(a) for a in arrays], indexing=indexing)
    theirs = torch.meshgrid(*[torch.tensor(a) for a in arrays], indexing=indexing)
    ref = np.meshgrid(*arrays, indexing=indexing)
    assert isinstance(ours, list) and len(ours) == len(lengths)
    for o, t, r in zip(ours, theirs, ref):
        np.testing.assert_array_equal(o.numpy(), t.numpy())
        np.testing.assert_array_equal(o.numpy(), r)
    compare_torch(torch, lambda *xs: F.stack(F.meshgrid(*xs, indexing=indexing)),
                  lambda *ts: torch.stack(torch.meshgrid(*ts, indexing=indexing)), arrays)


def test_meshgrid_megengine_example_and_errors():
    xv, yv = F.meshgrid(F.linspace(0, 1, 3), F.linspace(0, 1, 2))
    np.testing.assert_allclose(xv.numpy(), [[0, 0.5, 1], [0, 0.5, 1]])
    np.testing.assert_allclose(yv.numpy(), [[0, 0, 0], [1, 1, 1]])
    assert F.meshgrid() == []
    with pytest.raises(ValueError, match=r"meshgrid: every input must be 1-d, input 1 has shape \(2, 2\)"):
        F.meshgrid(gc.Tensor(np.zeros(3)), gc.Tensor(np.zeros((2, 2))))
    with pytest.raises(ValueError, match="meshgrid: indexing"):
        F.meshgrid(gc.Tensor(np.zeros(3)), indexing="xyz")


# ---------------------------------------------------------------- cond_take
@pytest.mark.parametrize("shape", [(2, 2), (7,), (2, 3, 4), (), (0, 3)])
def test_cond_take_values_and_grads(shape, rng):
    x, mask = rng.standard_normal(shape), rng.random(shape) < 0.5
    v, i = F.cond_take(gc.Tensor(mask), gc.Tensor(x))
    assert i.dtype == np.int32 and v.ndim == 1 and i.ndim == 1
    np.testing.assert_array_equal(v.numpy(), x[mask])
    np.testing.assert_array_equal(i.numpy(), np.flatnonzero(mask))
    _, (_, g), w = gc_vjp(lambda m, x: F.cond_take(m, x)[0], [mask, x])
    expected = np.zeros(x.size)
    expected[np.flatnonzero(mask)] = w
    np.testing.assert_array_equal(g, expected.reshape(shape))
    check_grads(lambda x: F.cond_take(gc.Tensor(mask), x)[0] ** 2, [x])


def test_cond_take_megengine_example_and_errors():
    mask = gc.Tensor(np.array([[True, False], [False, True]]))
    v, i = F.cond_take(mask, gc.Tensor(np.array([[1, INF], [np.nan, 4]], np.float32)))
    assert v.numpy().tolist() == [1.0, 4.0] and i.numpy().tolist() == [0, 3]
    with pytest.raises(TypeError, match="cond_take: mask must be a bool tensor, got int32"):
        F.cond_take(gc.tensor([1, 0]), gc.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"cond_take: .* same shape, got \(2,\) and \(3,\)"):
        F.cond_take(gc.Tensor(np.array([True, False])), gc.tensor([1.0, 2.0, 3.0]))


# ---------------------------------------------------------------- swapaxes
@pytest.mark.parametrize("shape, a, b", [((2, 3, 4), 0, 2), ((2, 3, 4), -1, 1), ((2, 3), 1, 1), ((5,), 0, -1)])
def test_swapaxes_vs_torch(shape, a, b, rng, torch):
    compare_torch(torch, lambda x: F.swapaxes(x, a, b), lambda t: torch.swapaxes(t, a, b), [rng.standard_normal(shape)])


def test_swapaxes_megengine_example_and_errors():
    x = gc.Tensor(np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], np.int32))
    np.testing.assert_array_equal(F.swapaxes(x, 0, 2).numpy(), [[[0, 4], [2, 6]], [[1, 5], [3, 7]]])
    with pytest.raises(ValueError, match="swapaxes: axis 3 is out of range for a 3-d tensor"):
        F.swapaxes(x, 0, 3)


# ---------------------------------------------------------------- the API itself
NEW_NN = ["layer_norm", "group_norm", "pad", "adaptive_avg_pool2d", "adaptive_max_pool2d", "conv1d",
          "pixel_shuffle", "topk_accuracy"]
NEW_TOP = ["argsort", "diag", "logaddexp", "atan2", "meshgrid", "cond_take", "swapaxes"]

MEGENGINE_PARAMS = {
    "layer_norm": ["inp", "normalized_shape", "affine", "weight", "bias", "eps"],
    "group_norm": ["inp", "num_groups", "affine", "weight", "bias", "eps"],
    "pad": ["src", "pad_width", "mode", "constant_value"],
    "adaptive_avg_pool2d": ["inp", "oshp"],
    "adaptive_max_pool2d": ["inp", "oshp"],
    "conv1d": ["inp", "weight", "bias", "stride", "padding", "dilation", "groups", "conv_mode", "compute_mode"],
    "pixel_shuffle": ["inp", "upscale_factor"],
    "topk_accuracy": ["logits", "target", "topk"],
    "argsort": ["inp", "descending"],
    "diag": ["inp", "k"],
    "logaddexp": ["x", "y"],
    "atan2": ["y", "x"],
    "meshgrid": ["inputs", "indexing"],
    "cond_take": ["mask", "x"],
    "swapaxes": ["inp", "axis1", "axis2"],
}


@pytest.mark.parametrize("name", NEW_NN + NEW_TOP)
def test_megengine_names_signatures_and_docs(name):
    fn = getattr(F, name)
    if name in NEW_NN:
        assert getattr(F.nn, name) is fn
    assert list(inspect.signature(fn).parameters) == MEGENGINE_PARAMS[name]
    assert fn.__doc__ and "Example::" in fn.__doc__
    assert all(p.annotation is not inspect.Parameter.empty for p in inspect.signature(fn).parameters.values())


@pytest.mark.parametrize("name", NEW_NN + NEW_TOP)
def test_docstring_examples_run(name):
    """Each docstring's example is a doctest: what it shows is what it gives."""
    fn = getattr(F, name)
    globs = {"gc": gc, "F": F, "np": np}
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(fn, name, globs=globs):
        runner.run(test)
    assert runner.failures == 0, f"{name}'s docstring example fails"
