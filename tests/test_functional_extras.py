"""MegEngine functional APIs written as composites of gradcore ops: isnan,
isinf, full_like, one_hot, relu6, hsigmoid, hswish, elu, prelu, the losses
(l1, square/mse, binary cross-entropy, hinge), normalize, repeat, tile, roll
and embedding.

Values against PyTorch (or NumPy where torch has no counterpart), first and
second order gradients against float64 finite differences, and gradients
(also second order) against torch's autograd where torch has the function.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.autodiff import GradManager
from oracle import check_grads64 as check_grads, compare_second_order, compare_torch, gc_vjp, torch_vjp

# a kernel computing 0/0, exp overflow, log(0)... is a bug here
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

INF = float("inf")





# ---------------------------------------------------------------- helpers
def away(rng, shape, kinks=(0.0,), lo=-8.0, hi=8.0, gap=0.05):
    """Uniform samples no closer than ``gap`` to any kink of a piecewise
    function, so finite differences never straddle one."""
    x = np.asarray(rng.uniform(lo, hi, shape), np.float64)
    for _ in range(100):
        near = np.zeros(x.shape, bool)
        for k in kinks:
            near |= np.abs(x - k) < gap
        if not near.any():
            return x
        x[near] = rng.uniform(lo, hi, int(near.sum()))
    raise AssertionError("could not sample away from the kinks")


SHAPES = [pytest.param(s, id=str(list(s)).replace(" ", "")) for s in [(), (1,), (7,), (3, 4), (2, 1, 3)]]


# ---------------------------------------------------------------- isnan, isinf
SPECIAL = np.array([0.0, -1.5, np.nan, INF, -INF, 3e38, -np.nan, 1e-300])


@pytest.mark.parametrize("name", ["isnan", "isinf"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_isnan_isinf_values(name, dtype, torch):
    with np.errstate(over="ignore"):
        x = SPECIAL.astype(dtype).reshape(2, 4)
    out = getattr(F, name)(gc.Tensor(x))
    assert out.dtype == np.bool_ and out.shape == (2, 4)
    np.testing.assert_array_equal(out.numpy(), getattr(np, name)(x))
    np.testing.assert_array_equal(out.numpy(), getattr(torch, name)(torch.tensor(x)).numpy())


@pytest.mark.parametrize("name", ["isnan", "isinf"])
@pytest.mark.parametrize("value", [np.nan, INF, -INF, 2.0])
def test_isnan_isinf_0d(name, value):
    out = getattr(F, name)(gc.Tensor(np.float64(value)))
    assert out.shape == () and out.dtype == np.bool_
    assert bool(out.numpy()) == bool(getattr(np, name)(value))


@pytest.mark.parametrize("name", ["isnan", "isinf"])
def test_isnan_isinf_integers_are_never_special(name):
    out = getattr(F, name)(gc.Tensor(np.array([0, -7, 2**31 - 1], np.int32)))
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out.numpy(), [False, False, False])


def test_isnan_isinf_as_masks_under_a_recording_manager(rng):
    """Used as masks inside a differentiated function (zeroing bad values):
    recording works and the gradient flows through the selected branch."""
    fn = lambda t: F.where(F.isnan(t) | F.isinf(t), F.zeros_like(t), t * 3.0)
    check_grads(fn, [rng.standard_normal((3, 4))])
    y, (g,), w = gc_vjp(fn, [np.array([1.0, np.nan, INF, -2.0])], weight=np.ones(4))
    np.testing.assert_array_equal(y, [3.0, 0.0, 0.0, -6.0])
    np.testing.assert_array_equal(g, [3.0, 0.0, 0.0, 3.0])


# ---------------------------------------------------------------- full_like
@pytest.mark.parametrize("dtype, value", [("float32", 2.5), ("float64", -1.0), ("int32", 7), ("int32", 7.9),
                                          ("bool", 1)])
@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_full_like(dtype, value, shape, torch):
    x = np.zeros(shape, dtype)
    out = F.full_like(gc.Tensor(x), value)
    assert out.dtype == np.dtype(dtype) and out.shape == shape and out.device == "cpu"
    np.testing.assert_array_equal(out.numpy(), np.full(shape, value, dtype))
    if dtype != "bool" and not (dtype == "int32" and isinstance(value, float)):
        np.testing.assert_array_equal(out.numpy(), torch.full_like(torch.tensor(x), value).numpy())


def test_full_like_is_a_constant(rng):
    """No gradient flows into ``inp`` through full_like."""
    x = rng.standard_normal((2, 3))
    check_grads(lambda t: F.full_like(t, 3.0) * t, [x])
    _, (g,), w = gc_vjp(lambda t: F.full_like(t, 3.0) * t, [x])
    np.testing.assert_allclose(g, 3.0 * w)


# ---------------------------------------------------------------- one_hot
@pytest.mark.parametrize("labels, num_classes", [
    pytest.param(np.array([1, 2, 3], np.int32), 4, id="megengine-example"),
    pytest.param(np.array([[0, 2], [1, 1]], np.int32), 3, id="2d"),
    pytest.param(np.array(2, np.int32), 5, id="0d"),
    pytest.param(np.array([0, 0], np.int32), 1, id="one-class"),
    pytest.param(np.array([4, 0, 4], np.int64), 5, id="int64"),
    pytest.param(np.zeros((0,), np.int32), 3, id="empty"),
])
def test_one_hot(labels, num_classes, torch):
    out = F.one_hot(gc.Tensor(labels), num_classes)
    assert out.dtype == np.int32 and out.shape == labels.shape + (num_classes,)
    expected = torch.nn.functional.one_hot(torch.tensor(labels.astype(np.int64)), num_classes).numpy()
    np.testing.assert_array_equal(out.numpy(), expected)


def test_one_hot_megengine_example():
    out = F.one_hot(gc.tensor(np.arange(1, 4, dtype=np.int32)), num_classes=4)
    np.testing.assert_array_equal(out.numpy(), [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])


@pytest.mark.parametrize("labels, num_classes, exc, needle", [
    (np.array([0.0, 1.0]), 3, TypeError, "integer"),
    (np.array([0, 3]), 3, ValueError, "[0, 3)"),
    (np.array([-1, 0]), 3, ValueError, "[0, 3)"),
    (np.array([0, 1]), 0, ValueError, "num_classes"),
    (np.array([0, 1]), 2.0, TypeError, "num_classes"),
])
def test_one_hot_bad_arguments(labels, num_classes, exc, needle):
    with pytest.raises(exc, match="one_hot") as ei:
        F.one_hot(gc.Tensor(labels), num_classes)
    assert needle in str(ei.value)

def test_one_hot_too_many_classes_names_one_hot():
    # the classes row alone (10**13 labels' worth) is more than any machine has: the
    # error names the call made, not the arange/eq inside it
    with pytest.raises(MemoryError, match=r"one_hot: num_classes=10000000000000 for labels of shape \(2,\)"):
        F.one_hot(gc.tensor([1, 2]), 10**13)



# ---------------------------------------------------------------- activations
def _tnn(torch):
    return torch.nn.functional


ACTS = {
    # name: (gradcore fn, torch fn, kinks, rtol against torch: torch's
    # hardsigmoid backward scales by a float32 1/6, even in float64)
    "relu6": (F.relu6, lambda T: _tnn(T).relu6, (0.0, 6.0), 1e-10),
    "hsigmoid": (F.hsigmoid, lambda T: _tnn(T).hardsigmoid, (-3.0, 3.0), 1e-7),
    "hswish": (F.hswish, lambda T: _tnn(T).hardswish, (-3.0, 3.0), 1e-10),
    "elu": (F.elu, lambda T: _tnn(T).elu, (0.0,), 1e-10),
    "elu-alpha": (lambda x: F.elu(x, 0.3), lambda T: (lambda t: _tnn(T).elu(t, 0.3)), (0.0,), 1e-10),
    "elu-alpha-kw": (lambda x: F.elu(x, alpha=2.0), lambda T: (lambda t: _tnn(T).elu(t, alpha=2.0)), (0.0,), 1e-10),
}
ACT_IDS = list(ACTS)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ACT_IDS)
def test_activation_vs_torch(name, shape, rng, torch):
    fn, tfn, kinks, rtol = ACTS[name]
    x = away(rng, shape, kinks)
    compare_torch(torch, fn, tfn(torch), [x], rtol=rtol)


@pytest.mark.parametrize("name", ACT_IDS)
def test_activation_grads(name, rng):
    fn, _, kinks, _ = ACTS[name]
    check_grads(fn, [away(rng, (3, 5), kinks)])


@pytest.mark.parametrize("name", [n for n in ACT_IDS if n != "hsigmoid"])   # torch: no double backward
def test_activation_second_order_vs_torch(name, rng, torch):
    fn, tfn, kinks, _ = ACTS[name]
    compare_second_order(torch, fn, tfn(torch), [away(rng, (2, 6), kinks)], rng)


@pytest.mark.parametrize("name", ACT_IDS)
def test_activation_values_at_kinks_and_far_out(name, torch):
    """Exact kink points and large magnitudes: values match torch's, and
    nothing overflows (exp of a large positive input would)."""
    fn, tfn, kinks, rtol = ACTS[name]
    x = np.array(sorted(set(kinks) | {-1e4, -40.0, -6.0, 6.0, 40.0, 800.0, 1e4}))
    out = fn(gc.Tensor(x)).numpy()
    np.testing.assert_allclose(out, tfn(torch)(torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-300)
    far = np.array([-1e4, -40.0, 40.0, 800.0, 1e4])
    compare_torch(torch, fn, tfn(torch), [far], rtol=rtol)


@pytest.mark.parametrize("name", ACT_IDS)
def test_activation_keeps_float32(name, rng):
    fn, _, kinks, _ = ACTS[name]
    x = away(rng, (4,), kinks).astype(np.float32)
    out, (g,), _ = gc_vjp(fn, [x])
    assert out.dtype == np.float32 and g.dtype == np.float32
    ref, (g64,), _ = gc_vjp(fn, [x.astype(np.float64)])
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g, g64, rtol=1e-5, atol=1e-6)


def test_activation_documented_values():
    np.testing.assert_allclose(F.hswish(gc.tensor(np.arange(5, dtype=np.float32))).numpy(),
                               [0.0, 0.6667, 1.6667, 3.0, 4.0], atol=1e-4)
    np.testing.assert_allclose(F.relu6(gc.tensor([-1.0, 3.0, 8.0])).numpy(), [0.0, 3.0, 6.0])
    np.testing.assert_allclose(F.hsigmoid(gc.tensor([-4.0, 0.0, 4.0])).numpy(), [0.0, 0.5, 1.0])


# ---------------------------------------------------------------- prelu
def test_prelu_per_channel_2d_vs_torch(rng, torch):
    x, w = away(rng, (4, 3)), rng.uniform(0.05, 0.5, (3,))
    compare_torch(torch, F.prelu, _tnn(torch).prelu, [x, w])


def test_prelu_shared_weight_vs_torch(rng, torch):
    x, w = away(rng, (2, 3, 2)), np.array([0.2])
    compare_torch(torch, F.prelu, _tnn(torch).prelu, [x, w])


@pytest.mark.parametrize("wshape", [(1, 3, 1, 1), (3, 1, 1)])
def test_prelu_nchw_vs_torch(wshape, rng, torch):
    """MegEngine's F.prelu broadcasts ``weight``; torch's takes one slope per
    channel of axis 1: the same function with weight reshaped."""
    x, w = away(rng, (2, 3, 2, 2)), rng.uniform(-0.5, 0.5, (3,))
    out, (gx, gw), wt = gc_vjp(F.prelu, [x, w.reshape(wshape)])
    t_out, (tgx, tgw) = torch_vjp(torch, _tnn(torch).prelu, [x, w], wt)
    np.testing.assert_allclose(out, t_out, rtol=1e-12)
    np.testing.assert_allclose(gx, tgx, rtol=1e-12)
    assert gw.shape == wshape
    np.testing.assert_allclose(gw.reshape(3), tgw, rtol=1e-10)


def test_prelu_0d_and_grads(rng):
    np.testing.assert_allclose(F.prelu(gc.Tensor(np.float64(-2.0)), gc.Tensor(np.float64(0.5))).numpy(), -1.0)
    np.testing.assert_allclose(F.prelu(gc.Tensor(np.float64(2.0)), gc.Tensor(np.float64(0.5))).numpy(), 2.0)
    check_grads(F.prelu, [away(rng, (3, 4)), rng.uniform(0.1, 0.9, (4,))])
    check_grads(F.prelu, [away(rng, ()), np.float64(0.3)])


def test_prelu_second_order_vs_torch(rng, torch):
    compare_second_order(torch, F.prelu, _tnn(torch).prelu, [away(rng, (3, 4)), rng.uniform(0.1, 0.9, (4,))], rng)


def test_prelu_weight_from_array_and_bad_shape(rng):
    x = away(rng, (2, 3))
    np.testing.assert_allclose(F.prelu(gc.Tensor(x), [0.1, 0.2, 0.3]).numpy(),
                               np.maximum(x, 0) + np.array([0.1, 0.2, 0.3]) * np.minimum(x, 0))
    with pytest.raises(ValueError):
        F.prelu(gc.Tensor(x), gc.Tensor(np.ones(4)))


# ---------------------------------------------------------------- l1 / square (mse)
LOSS_SHAPES = [pytest.param(s, id=str(list(s)).replace(" ", "")) for s in [(), (5,), (2, 3), (1, 1)]]
REDUCTIONS = ["mean", "sum", "none"]


def _torch_regression(torch, name, reduction):
    f = _tnn(torch).l1_loss if name == "l1_loss" else _tnn(torch).mse_loss
    return lambda p, y: f(p, y, reduction=reduction)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOSS_SHAPES)
@pytest.mark.parametrize("name", ["l1_loss", "square_loss", "mse_loss"])
def test_regression_losses_vs_torch(name, shape, reduction, rng, torch):
    pred = rng.standard_normal(shape)
    label = pred + away(rng, shape, lo=-2, hi=2)       # |pred - label| away from 0
    fn = lambda p, y: getattr(F, name)(p, y, reduction=reduction)
    compare_torch(torch, fn, _torch_regression(torch, name, reduction), [pred, label])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", ["l1_loss", "square_loss"])
def test_regression_losses_grads(name, reduction, rng):
    pred = rng.standard_normal((3, 4))
    label = pred + away(rng, (3, 4), lo=-2, hi=2)
    check_grads(lambda p, y: getattr(F, name)(p, y, reduction=reduction), [pred, label])


@pytest.mark.parametrize("name", ["l1_loss", "square_loss"])
def test_regression_losses_second_order_vs_torch(name, rng, torch):
    pred = rng.standard_normal((3, 4))
    label = pred + away(rng, (3, 4), lo=-2, hi=2)
    compare_second_order(torch, lambda p, y: getattr(F, name)(p, y, reduction="sum") ** 2,
                         lambda p, y: _torch_regression(torch, name, "sum")(p, y) ** 2,
                         [pred, label], rng)


@pytest.mark.parametrize("name, np_fn", [("l1_loss", np.abs), ("square_loss", np.square)])
def test_regression_losses_broadcast_label(name, np_fn, rng):
    pred, label = rng.standard_normal((3, 4)), rng.standard_normal((4,)) + 5.0
    out = getattr(F, name)(gc.Tensor(pred), gc.Tensor(label), reduction="none")
    np.testing.assert_allclose(out.numpy(), np_fn(pred - label), rtol=1e-12)
    check_grads(lambda p, y: getattr(F, name)(p, y), [pred, label])


def test_regression_losses_documented_values():
    pred, label = gc.tensor([3.0, 3.0, 3.0, 3.0]), gc.tensor([2.0, 8.0, 6.0, 1.0])
    assert F.l1_loss(pred, label).item() == pytest.approx(2.75)
    np.testing.assert_allclose(F.l1_loss(pred, label, reduction="none").numpy(), [1, 5, 3, 2])
    assert F.l1_loss(pred, label, reduction="sum").item() == pytest.approx(11.0)
    assert F.square_loss(pred, label).item() == pytest.approx(9.75)
    assert F.square_loss(pred, label, reduction="sum").item() == pytest.approx(39.0)
    assert F.mse_loss is F.square_loss


def test_square_loss_of_integers_is_float32():
    # MegEngine's square_loss is ``(pred - label) ** 2``; a power of integers is float32
    pred, label = np.array([3, 3, 3, 3], np.int32), np.array([2, 8, 6, 1], np.int32)
    for reduction, want in (("none", (pred - label).astype(np.float64) ** 2),
                            ("sum", np.sum((pred - label).astype(np.float64) ** 2)),
                            ("mean", np.mean((pred - label).astype(np.float64) ** 2))):
        out = F.square_loss(gc.Tensor(pred), gc.Tensor(label), reduction=reduction)
        assert out.dtype == np.float32, reduction
        np.testing.assert_array_equal(out.numpy(), want)
    # l1_loss stays integer (MegEngine's is ``abs(pred - label)``) until a mean
    assert F.l1_loss(gc.Tensor(pred), gc.Tensor(label), reduction="sum").dtype == np.int32


def test_loss_keeps_pred_dtype_with_integer_labels():
    pred = gc.Tensor(np.array([0.5, 2.0, -1.0], np.float32))
    label = gc.Tensor(np.array([1, 2, -1], np.int32))
    for fn in (F.l1_loss, F.square_loss, F.binary_cross_entropy):
        assert fn(pred, label).dtype == np.float32, fn.__name__
    scores, signs = gc.Tensor(np.ones((2, 2), np.float32)), gc.Tensor(np.ones((2, 2), np.int32))
    assert F.hinge_loss(scores, signs).dtype == np.float32


# ---------------------------------------------------------------- binary_cross_entropy
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOSS_SHAPES)
def test_bce_with_logits_vs_torch(shape, reduction, rng, torch):
    pred, label = rng.standard_normal(shape) * 3, rng.uniform(0, 1, shape)
    compare_torch(torch, lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction),
                  lambda p, y: _tnn(torch).binary_cross_entropy_with_logits(p, y, reduction=reduction),
                  [pred, label])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", LOSS_SHAPES)
def test_bce_probabilities_vs_torch(shape, reduction, rng, torch):
    pred, label = rng.uniform(0.05, 0.95, shape), rng.uniform(0, 1, shape)
    compare_torch(torch, lambda p, y: F.binary_cross_entropy(p, y, with_logits=False, reduction=reduction),
                  lambda p, y: _tnn(torch).binary_cross_entropy(p, y, reduction=reduction),
                  [pred, label])


def test_bce_extreme_logits_are_stable(torch):
    pred = np.array([-800.0, -100.0, -30.0, 0.0, 30.0, 100.0, 800.0])
    label = np.array([0.0, 1.0, 0.3, 1.0, 0.0, 1.0, 0.5])
    compare_torch(torch, lambda p, y: F.binary_cross_entropy(p, y, reduction="none"),
                  lambda p, y: _tnn(torch).binary_cross_entropy_with_logits(p, y, reduction="none"),
                  [pred, label])


@pytest.mark.parametrize("with_logits", [True, False])
def test_bce_grads(with_logits, rng):
    pred = rng.standard_normal((2, 3)) if with_logits else rng.uniform(0.1, 0.9, (2, 3))
    label = rng.uniform(0, 1, (2, 3))
    check_grads(lambda p, y: F.binary_cross_entropy(p, y, with_logits=with_logits), [pred, label])


@pytest.mark.parametrize("with_logits", [True, False])
def test_bce_second_order_vs_torch(with_logits, rng, torch):
    pred = rng.standard_normal((2, 3)) if with_logits else rng.uniform(0.1, 0.9, (2, 3))
    label = rng.uniform(0, 1, (2, 3))
    tf = _tnn(torch).binary_cross_entropy_with_logits if with_logits else _tnn(torch).binary_cross_entropy
    compare_second_order(torch, lambda p, y: F.binary_cross_entropy(p, y, with_logits=with_logits, reduction="none"),
                         lambda p, y: tf(p, y, reduction="none"), [pred, label], rng)


def test_bce_broadcast_label(rng):
    pred, label = rng.standard_normal((3, 2)), np.array([1.0, 0.0])
    expected = np.logaddexp(0, -pred) + (1 - label) * pred
    np.testing.assert_allclose(F.binary_cross_entropy(gc.Tensor(pred), label, reduction="none").numpy(),
                               expected, rtol=1e-12)
    check_grads(lambda p: F.binary_cross_entropy(p, label), [pred])


def test_bce_documented_values():
    pred, label = gc.tensor([0.9, 0.7, 0.3]), gc.tensor([1.0, 1.0, 1.0])
    assert F.binary_cross_entropy(pred, label).item() == pytest.approx(0.4328984, abs=1e-6)
    np.testing.assert_allclose(F.binary_cross_entropy(pred, label, reduction="none").numpy(),
                               [0.3412, 0.4032, 0.5544], atol=1e-4)
    assert F.binary_cross_entropy(pred, label, with_logits=False).item() == pytest.approx(0.5553361, abs=1e-6)
    zero = gc.tensor(np.zeros((1, 2), np.float32))
    assert F.binary_cross_entropy(zero, gc.tensor(np.ones((1, 2), np.float32))).item() == pytest.approx(np.log(2))


# ---------------------------------------------------------------- hinge_loss
def np_hinge(pred, label, norm="L1", reduction="mean"):
    m = np.maximum(0.0, 1.0 - pred * label)
    loss = (m if norm.upper() == "L1" else m * m).sum(axis=1)
    return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]


def _hinge_case(rng, shape):
    label = rng.choice([-1.0, 1.0], shape)
    pred = away(rng, shape, kinks=(-1.0, 1.0), lo=-3, hi=3)   # 1 - pred * label never 0
    return pred, label


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("norm", ["L1", "L2"])
@pytest.mark.parametrize("shape", [(4, 3), (1, 1), (2, 3, 2)])
def test_hinge_loss_values_and_grads_vs_torch(shape, norm, reduction, rng, torch):
    pred, label = _hinge_case(rng, shape)
    fn = lambda p, y: F.hinge_loss(p, y, norm=norm, reduction=reduction)
    np.testing.assert_allclose(fn(gc.Tensor(pred), gc.Tensor(label)).numpy(),
                               np_hinge(pred, label, norm, reduction), rtol=1e-12)

    def tfn(p, y):   # torch has no hinge loss of this form: its autograd on the formula
        m = torch.relu(1 - p * y)
        loss = (m if norm == "L1" else m * m).sum(1)
        return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]
    compare_torch(torch, fn, tfn, [pred, label])


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_loss_grads(norm, rng):
    pred, label = _hinge_case(rng, (3, 4))
    check_grads(lambda p, y: F.hinge_loss(p, y, norm=norm), [pred, label])


def test_hinge_loss_documented_values():
    pred = gc.tensor([[0.5, -0.5, 0.1], [-0.6, 0.7, 0.8]])
    label = gc.tensor([[1, -1, -1], [-1, 1, 1]], dtype="float32")
    assert F.hinge_loss(pred, label).item() == pytest.approx(1.5)
    np.testing.assert_allclose(F.hinge_loss(pred, label, reduction="none").numpy(), [2.1, 0.9], rtol=1e-6)
    assert F.hinge_loss(pred, label, reduction="sum").item() == pytest.approx(3.0)
    # the norm's name is not case sensitive, as in MegEngine
    assert F.hinge_loss(pred, label, norm="l2").item() == pytest.approx(F.hinge_loss(pred, label, "L2").item())
    assert F.hinge_loss(pred, label, "L2").item() == pytest.approx(np_hinge(pred.numpy(), label.numpy(), "L2"))


def test_hinge_loss_bad_arguments():
    pred, label = gc.Tensor(np.zeros((2, 3))), gc.Tensor(np.ones((2, 3)))
    with pytest.raises(ValueError, match="hinge_loss.*norm"):
        F.hinge_loss(pred, label, norm="L3")
    with pytest.raises(ValueError, match=r"hinge_loss.*\(3,\)"):
        F.hinge_loss(gc.Tensor(np.zeros(3)), gc.Tensor(np.ones(3)))


@pytest.mark.parametrize("name", ["l1_loss", "square_loss", "binary_cross_entropy", "hinge_loss", "cross_entropy"])
def test_losses_bad_reduction(name):
    pred = gc.Tensor(np.zeros((2, 3)))
    label = gc.Tensor(np.zeros(2, np.int32) if name == "cross_entropy" else np.ones((2, 3)))
    with pytest.raises(ValueError, match=f"{name}: reduction must be") as ei:
        getattr(F, name)(pred, label, reduction="avg")
    assert "'avg'" in str(ei.value)


# ---------------------------------------------------------------- normalize
NORM_CASES = [
    pytest.param((5,), None, 0, id="vector-default"),
    pytest.param((3, 4), None, 1, id="rows"),
    pytest.param((3, 4), 2, -1, id="rows-neg-axis"),
    pytest.param((3, 4), 1, 0, id="l1-cols"),
    pytest.param((2, 3, 4), 3, -2, id="l3"),
    pytest.param((3, 4), INF, 1, id="linf"),
    pytest.param((1, 1), None, 1, id="size1"),
    pytest.param((4, 1), 2, 0, id="column"),
]


@pytest.mark.parametrize("shape, ord, axis", NORM_CASES)
def test_normalize_vs_torch(shape, ord, axis, rng, torch):
    x = away(rng, shape, lo=-3, hi=3)
    p = 2.0 if ord is None else ord
    compare_torch(torch, lambda t: F.normalize(t, ord, axis), lambda t: _tnn(torch).normalize(t, p, axis), [x])


@pytest.mark.parametrize("shape, ord, axis", NORM_CASES[:5])
def test_normalize_grads(shape, ord, axis, rng):
    check_grads(lambda t: F.normalize(t, ord=ord, axis=axis), [away(rng, shape, lo=-3, hi=3)])


@pytest.mark.parametrize("ord", [None, 1, 3])
def test_normalize_second_order_vs_torch(ord, rng, torch):
    x = away(rng, (3, 4), lo=-3, hi=3)
    p = 2.0 if ord is None else ord
    compare_second_order(torch, lambda t: F.normalize(t, ord, 1), lambda t: _tnn(torch).normalize(t, p, 1), [x], rng)


@pytest.mark.parametrize("shape", [(), (6,), (2, 3)])
def test_normalize_whole_tensor(shape, rng):
    """axis=None: the whole tensor is one vector (MegEngine requires a vector there)."""
    x = away(rng, shape, lo=-3, hi=3)
    out = F.normalize(gc.Tensor(x))
    assert out.shape == shape
    np.testing.assert_allclose(out.numpy(), x / max(np.sqrt((x * x).sum()), 1e-12), rtol=1e-12)
    np.testing.assert_allclose(F.normalize(gc.Tensor(x), ord=1).numpy(), x / np.abs(x).sum(), rtol=1e-12)
    check_grads(lambda t: F.normalize(t), [x])


@pytest.mark.parametrize("ord", [None, 1])
def test_normalize_zero_vector_has_finite_gradient(ord, torch):
    """A zero row stays zero; its gradient is finite and torch's (w / eps)."""
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 2.0]])
    p = 2.0 if ord is None else ord
    out, (g,), _ = gc_vjp(lambda t: F.normalize(t, ord, 1), [x])
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(out[0], 0.0)
    compare_torch(torch, lambda t: F.normalize(t, ord, 1), lambda t: _tnn(torch).normalize(t, p, 1), [x])


def test_normalize_large_eps_clips(rng, torch):
    x = away(rng, (3, 4), lo=-1, hi=1)
    compare_torch(torch, lambda t: F.normalize(t, axis=1, eps=5.0),
                  lambda t: _tnn(torch).normalize(t, 2.0, 1, 5.0), [x])
    check_grads(lambda t: F.normalize(t, axis=1, eps=5.0), [x])


def test_normalize_documented_values():
    x = gc.tensor([[1.0, 2, 3], [4, 5, 6]])
    np.testing.assert_allclose(F.normalize(x, ord=2, axis=0).numpy(),
                               [[0.2425, 0.3714, 0.4472], [0.9701, 0.9285, 0.8944]], atol=1e-4)
    np.testing.assert_allclose(F.normalize(x, ord=2, axis=1).numpy(),
                               [[0.2673, 0.5345, 0.8018], [0.4558, 0.5698, 0.6838]], atol=1e-4)


# ---------------------------------------------------------------- repeat
REPEAT_CASES = [
    pytest.param((), 3, None, id="0d"),
    pytest.param((4,), 2, 0, id="1d"),
    pytest.param((2, 3), 3, None, id="flatten"),
    pytest.param((2, 3), 2, -1, id="neg-axis"),
    pytest.param((2, 3), 1, 0, id="once"),
    pytest.param((1, 3), 4, 0, id="size1-axis"),
    pytest.param((2, 1, 3), 2, 1, id="middle-size1"),
    pytest.param((2, 3), 0, 1, id="zero"),
]


@pytest.mark.parametrize("shape, repeats, axis", REPEAT_CASES)
def test_repeat_vs_numpy_and_torch(shape, repeats, axis, rng, torch):
    x = rng.standard_normal(shape)
    out = F.repeat(gc.Tensor(x), repeats, axis)
    np.testing.assert_array_equal(out.numpy(), np.repeat(x, repeats, axis))
    assert out.dtype == np.float64
    compare_torch(torch, lambda t: F.repeat(t, repeats, axis),
                  lambda t: torch.repeat_interleave(t, repeats, axis), [x])


@pytest.mark.parametrize("shape, repeats, axis", REPEAT_CASES[:-1])
def test_repeat_grads(shape, repeats, axis, rng):
    check_grads(lambda t: F.repeat(t, repeats, axis) ** 2, [rng.standard_normal(shape)])


def test_repeat_integers_keep_dtype():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = F.repeat(gc.Tensor(x), 2, axis=0)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.numpy(), np.repeat(x, 2, 0))


@pytest.mark.parametrize("call, exc, needle", [
    (lambda x: F.repeat(x, [2]), TypeError, "repeats"),
    (lambda x: F.repeat(x, 2.0), TypeError, "repeats"),
    (lambda x: F.repeat(x, -1), ValueError, "repeats"),
    (lambda x: F.repeat(x, 2, axis=2), ValueError, "axis 2"),
    (lambda x: F.repeat(x, 2, axis=-3), ValueError, "axis -3"),
    (lambda x: F.repeat(x[0, 0], 2, axis=0), ValueError, "0-d"),
])
def test_repeat_bad_arguments(call, exc, needle):
    with pytest.raises(exc, match="repeat") as ei:
        call(gc.Tensor(np.zeros((2, 3))))
    assert needle in str(ei.value)


# ---------------------------------------------------------------- tile
TILE_CASES = [
    pytest.param((3,), (2,), id="1d"),
    pytest.param((3,), 2, id="int-reps"),
    pytest.param((2, 3), (2, 1), id="2d"),
    pytest.param((2, 3), (3,), id="short-reps"),
    pytest.param((2, 3), (2, 1, 2), id="long-reps"),
    pytest.param((), (3,), id="0d"),
    pytest.param((), (), id="0d-no-reps"),
    pytest.param((1, 1), (1, 1), id="ones"),
    pytest.param((2, 1, 3), (1, 4, 1), id="size1-axis"),
    pytest.param((2, 3), (0, 2), id="zero"),
]


@pytest.mark.parametrize("shape, reps", TILE_CASES)
def test_tile_vs_numpy_and_torch(shape, reps, rng, torch):
    x = rng.standard_normal(shape)
    out = F.tile(gc.Tensor(x), reps)
    np.testing.assert_array_equal(out.numpy(), np.tile(x, reps))
    treps = (reps,) if isinstance(reps, int) else reps
    compare_torch(torch, lambda t: F.tile(t, reps), lambda t: torch.tile(t, treps), [x])


@pytest.mark.parametrize("shape, reps", TILE_CASES[:-1])
def test_tile_grads(shape, reps, rng):
    check_grads(lambda t: F.tile(t, reps) ** 2, [rng.standard_normal(shape)])


def test_tile_megengine_example():
    x = gc.tensor(np.array([[1, 2], [3, 4]], np.int32))
    out = F.tile(x, (2, 1))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.numpy(), [[1, 2], [3, 4], [1, 2], [3, 4]])


@pytest.mark.parametrize("reps, exc, needle", [
    ((2, -1), ValueError, "reps must be >= 0"),
    ((1.5,), TypeError, "reps must be an int"),
    (None, TypeError, "reps"),
])
def test_tile_bad_arguments(reps, exc, needle):
    with pytest.raises(exc, match="tile") as ei:
        F.tile(gc.Tensor(np.zeros((2, 3))), reps)
    assert needle in str(ei.value)


# ---------------------------------------------------------------- roll
ROLL_CASES = [
    pytest.param((5,), 2, None, id="1d"),
    pytest.param((5,), -7, None, id="neg-wrap"),
    pytest.param((2, 3), 1, None, id="flatten"),
    pytest.param((2, 3), 1, 1, id="axis1"),
    pytest.param((2, 3), -1, -1, id="neg-axis"),
    pytest.param((2, 3), 4, 0, id="past-size"),
    pytest.param((2, 3), (1, 2), (0, 1), id="two-axes"),
    pytest.param((2, 3, 2), (1, -1), (-1, 0), id="3d-two-axes"),
    pytest.param((2, 3), (1, 1), (1, 1), id="same-axis-twice"),
    pytest.param((), 3, None, id="0d"),
    pytest.param((2, 3), 0, 1, id="no-shift"),
    pytest.param((2, 3), 3, 1, id="full-turn"),
    pytest.param((1, 4), 3, 0, id="size1-axis"),
]


@pytest.mark.parametrize("shape, shift, axis", ROLL_CASES)
def test_roll_vs_numpy_and_torch(shape, shift, axis, rng, torch):
    x = rng.standard_normal(shape)
    xt = gc.Tensor(x)
    out = F.roll(xt, shift, axis)
    assert out is not xt
    np.testing.assert_array_equal(out.numpy(), np.roll(x, shift, axis))
    compare_torch(torch, lambda t: F.roll(t, shift, axis), lambda t: torch.roll(t, shift, axis), [x])


@pytest.mark.parametrize("shape, shift, axis", ROLL_CASES)
def test_roll_grads(shape, shift, axis, rng):
    check_grads(lambda t: F.roll(t, shift, axis) ** 2, [rng.standard_normal(shape)])


def test_roll_integers_keep_dtype():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = F.roll(gc.Tensor(x), 1, axis=1)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.numpy(), [[2, 0, 1], [5, 3, 4]])


@pytest.mark.parametrize("call, exc, needle", [
    (lambda x: F.roll(x, (1, 2), (0,)), ValueError, "same length"),
    (lambda x: F.roll(x, 1, 2), ValueError, "axis 2"),
    (lambda x: F.roll(x, (1, 2)), TypeError, "shift must be an int"),
    (lambda x: F.roll(x, 1.5, 0), TypeError, "shift"),
    (lambda x: F.roll(x, 1, 0.0), TypeError, "axis"),
])
def test_roll_bad_arguments(call, exc, needle):
    with pytest.raises(exc, match="roll") as ei:
        call(gc.Tensor(np.zeros((2, 3))))
    assert needle in str(ei.value)


# ---------------------------------------------------------------- embedding
EMB_CASES = [
    pytest.param(np.array([0, 3, 0, 1, 3]), (4, 3), id="1d-repeats"),
    pytest.param(np.array([[2, 0, 2], [1, 1, 3]]), (4, 3), id="2d"),
    pytest.param(np.array(2), (4, 3), id="0d"),
    pytest.param(np.array([[0]]), (1, 2), id="size1"),
    pytest.param(np.array([1, 1], np.int64), (2, 1), id="int64"),
]


@pytest.mark.parametrize("idx, wshape", EMB_CASES)
def test_embedding_vs_torch(idx, wshape, rng, torch):
    w = rng.standard_normal(wshape)
    out = F.embedding(gc.Tensor(idx), gc.Tensor(w))
    assert out.shape == idx.shape + (wshape[1],)
    compare_torch(torch, lambda i, t: F.embedding(i, t), lambda i, t: _tnn(torch).embedding(i, t), [idx, w])


@pytest.mark.parametrize("idx, wshape", EMB_CASES)
def test_embedding_grads(idx, wshape, rng):
    index = gc.Tensor(idx)
    check_grads(lambda t: F.embedding(index, t) ** 2, [rng.standard_normal(wshape)])


def test_embedding_repeated_rows_accumulate():
    w = np.arange(6.0).reshape(3, 2)
    _, (_, g), _ = gc_vjp(lambda i, t: F.embedding(i, t), [np.array([2, 2, 0, 2]), w], weight=np.ones((4, 2)))
    np.testing.assert_array_equal(g, [[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]])


def test_embedding_index_from_a_list():
    w = gc.Tensor(np.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(F.embedding([[2, 0]], w).numpy(), [[[4.0, 5.0], [0.0, 1.0]]])


@pytest.mark.parametrize("call, exc, needle", [
    (lambda w: F.embedding(gc.Tensor(np.array([0.0, 1.0])), w), TypeError, "integer"),
    (lambda w: F.embedding(gc.Tensor(np.array([0, 1])), w, padding_idx=0), ValueError, "padding_idx"),
    (lambda w: F.embedding(gc.Tensor(np.array([0, 1])), w, max_norm=1.0), ValueError, "max_norm"),
    (lambda w: F.embedding(gc.Tensor(np.array([0, 1])), w[0]), ValueError, "2-d"),
])
def test_embedding_bad_arguments(call, exc, needle):
    with pytest.raises(exc, match="embedding") as ei:
        call(gc.Tensor(np.zeros((3, 2))))
    assert needle in str(ei.value)


def test_embedding_index_out_of_range():
    with pytest.raises(IndexError, match="out of bounds"):
        F.embedding(gc.Tensor(np.array([0, 3])), gc.Tensor(np.zeros((3, 2))))


# ---------------------------------------------------------------- dtypes
FLOAT_FNS = [
    pytest.param(F.relu6, id="relu6"), pytest.param(F.hswish, id="hswish"), pytest.param(F.elu, id="elu"),
    pytest.param(lambda t: F.prelu(t, t[0] * 0.1), id="prelu"),
    pytest.param(lambda t: F.l1_loss(t, t[::-1] * 2.0), id="l1_loss"),
    pytest.param(lambda t: F.square_loss(t, t[::-1] * 2.0), id="square_loss"),
    pytest.param(lambda t: F.binary_cross_entropy(t, F.sigmoid(t[::-1])), id="bce"),
    pytest.param(lambda t: F.hinge_loss(t, F.sign(t[::-1])), id="hinge_loss"),
    pytest.param(lambda t: F.normalize(t, axis=1), id="normalize"),
    pytest.param(lambda t: F.repeat(t, 2, 1), id="repeat"),
    pytest.param(lambda t: F.tile(t, (2, 1)), id="tile"),
    pytest.param(lambda t: F.roll(t, 1, 0), id="roll"),
    pytest.param(lambda t: F.embedding(gc.Tensor(np.array([2, 0, 2])), t), id="embedding"),
]


@pytest.mark.parametrize("fn", FLOAT_FNS)
def test_float32_in_float32_out(fn, rng):
    x = away(rng, (3, 3), kinks=(0.0, -1.0, 1.0), lo=-2, hi=2).astype(np.float32)
    out, (g,), _ = gc_vjp(fn, [x])
    assert out.dtype == np.float32 and g.dtype == np.float32
    out64, (g64,), _ = gc_vjp(fn, [x.astype(np.float64)])
    np.testing.assert_allclose(out, out64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g, g64, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- API surface
NEW = ["isnan", "isinf", "full_like", "one_hot", "relu6", "hsigmoid", "hswish", "elu", "prelu", "l1_loss",
       "square_loss", "mse_loss", "binary_cross_entropy", "hinge_loss", "normalize", "repeat", "tile", "roll",
       "embedding"]
IN_NN = ["one_hot", "relu6", "hsigmoid", "hswish", "prelu", "l1_loss", "square_loss", "binary_cross_entropy",
         "hinge_loss", "normalize", "embedding"]


@pytest.mark.parametrize("name", IN_NN)
def test_in_f_nn_as_in_megengine(name):
    assert getattr(F.nn, name) is getattr(F, name)


@pytest.mark.parametrize("name", NEW)
def test_documented_with_an_example(name):
    fn = getattr(F, name)
    assert fn.__doc__ and "Example::" in fn.__doc__, name
    assert inspect.signature(fn).return_annotation not in (inspect.Signature.empty, None), name


@pytest.mark.parametrize("name, defaults", [
    ("elu", {"alpha": 1.0}),
    ("l1_loss", {"reduction": "mean"}),
    ("square_loss", {"reduction": "mean"}),
    ("binary_cross_entropy", {"with_logits": True, "reduction": "mean"}),
    ("hinge_loss", {"norm": "L1", "reduction": "mean"}),
    ("normalize", {"ord": None, "axis": None, "eps": 1e-12}),
    ("repeat", {"axis": None}),
    ("roll", {"axis": None}),
    ("embedding", {"padding_idx": None, "max_norm": None, "norm_type": None}),
])
def test_megengine_defaults(name, defaults):
    params = inspect.signature(getattr(F, name)).parameters
    for k, v in defaults.items():
        assert params[k].default == v, (name, k)


# ---------------------------------------------------------------- MegEngine's forms of the core functional API
def test_full_infers_its_dtype_from_the_value():
    assert F.full((2, 3), 6).dtype == np.int32
    assert F.full((2,), 6.5).dtype == np.float32
    assert F.full((2,), True).dtype == np.bool_
    assert F.full(3, 1, dtype="float64").numpy().tolist() == [1.0, 1.0, 1.0]


def test_eye_takes_megengines_argument_names():
    np.testing.assert_array_equal(F.eye(N=4, M=2).numpy(), np.eye(4, 2, dtype=np.float32))
    with pytest.raises(ValueError, match="eye"):
        F.eye(-1)
    with pytest.raises(ValueError, match="arange"):
        F.arange(0, 5, 0)


@pytest.mark.parametrize("start, end", [(3, -1), (0, 4), (2, 1), (-1, 0)])
def test_flatten_rejects_bad_axes(start, end):
    with pytest.raises(ValueError, match="flatten"):
        F.flatten(gc.Tensor(np.zeros((2, 3, 4))), start, end)


def test_device_arguments_of_copy_concat_stack():
    x = gc.Tensor(np.ones((2, 3)))
    assert F.copy(x, device="cpu").device == x.device
    assert F.concat([x, x], axis=0, device="cpu").shape == (4, 3)
    assert F.stack([x, x], axis=1, device="cpu").shape == (2, 2, 3)
    assert inspect.signature(F.copy).parameters["inp"].default is inspect.Parameter.empty


def test_matmul_of_mismatched_vectors_names_the_given_shapes():
    with pytest.raises(ValueError, match=r"matmul.*\(3,\).*\(4,\)"):
        F.matmul(gc.Tensor(np.ones(3)), gc.Tensor(np.ones(4)))
    with pytest.raises(ValueError, match=r"matmul.*\(2, 3\).*\(4,\)"):
        F.matmul(gc.Tensor(np.ones((2, 3))), gc.Tensor(np.ones(4)))
    assert F.matmul(gc.Tensor(np.ones((3, 2))), gc.Tensor(np.ones(3)), transpose_a=True).shape == (2,)


def test_norm_minus_inf_is_the_smallest_magnitude(rng, torch):
    x = rng.standard_normal((3, 4))
    fn = lambda t: F.norm(t, -INF, 1)
    compare_torch(torch, fn, lambda t: torch.linalg.vector_norm(t, -INF, 1), [x])
    assert inspect.signature(F.norm).parameters["ord"].default is None


def test_std_of_constant_data_has_a_zero_gradient(rng, torch):
    # PyTorch's: 0 where the deviation is 0, not 0 * inf
    x = np.array([[1.5, 1.5, 1.5], [0.0, 1.0, 3.0]])
    compare_torch(torch, lambda t: F.std(t, 1), lambda t: t.std(1, unbiased=False), [x])
    compare_second_order(torch, lambda t: F.std(t, 1), lambda t: t.std(1, unbiased=False), [x[1:]], rng)


def test_batch_norm_inplace_false_returns_the_new_statistics(rng, torch):
    x = rng.standard_normal((4, 3, 2, 2))
    rm, rv = rng.standard_normal((1, 3, 1, 1)), rng.uniform(0.5, 2, (1, 3, 1, 1))
    grm, grv = gc.Tensor(rm), gc.Tensor(rv)
    y, new_mean, new_var = F.batch_norm(gc.Tensor(x), grm, grv, training=True, momentum=0.8, inplace=False)
    np.testing.assert_array_equal(grm.numpy(), rm)          # the buffers are left alone
    np.testing.assert_array_equal(grv.numpy(), rv)
    trm, trv = torch.tensor(rm.reshape(-1)), torch.tensor(rv.reshape(-1))
    ty = torch.nn.functional.batch_norm(torch.tensor(x), trm, trv, training=True, momentum=0.2)
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(new_mean.numpy().reshape(-1), trm.numpy(), rtol=1e-10)
    np.testing.assert_allclose(new_var.numpy().reshape(-1), trv.numpy(), rtol=1e-10)
    # (C,) statistics come back (1, C, 1, 1), as MegEngine's
    _, m1, v1 = F.batch_norm(gc.Tensor(x), gc.Tensor(rm.reshape(-1)), gc.Tensor(rv.reshape(-1)), training=True,
                             momentum=0.8, inplace=False)
    assert m1.shape == v1.shape == (1, 3, 1, 1)
    np.testing.assert_allclose(m1.numpy(), new_mean.numpy(), rtol=1e-12)
    # only the running variance given: it alone is updated (in place by default)
    grv = gc.Tensor(rv)
    F.batch_norm(gc.Tensor(x), None, grv, training=True, momentum=0.8)
    np.testing.assert_allclose(grv.numpy().reshape(-1), trv.numpy(), rtol=1e-10)
    with pytest.raises(ValueError, match="batch_norm.*running"):
        F.batch_norm(gc.Tensor(x), None, None, training=False)


def test_relu6_and_hsigmoid_gradients_at_their_kinks_follow_torch(torch):
    v = np.array([-4.0, -3.0, -1.0, 0.0, 3.0, 6.0, 8.0])
    for fn, tfn in ((F.relu6, _tnn(torch).relu6), (F.hsigmoid, _tnn(torch).hardsigmoid)):
        x = gc.tensor(v, dtype="float64")
        gm = GradManager().attach(x)
        with gm:
            y = fn(x)
            gm.backward(y.sum())
        t = torch.tensor(v, requires_grad=True)
        ty = tfn(t)
        ty.sum().backward()
        np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
        assert not np.signbit(y.numpy()).any()          # no -0.0 below the kink
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-7)
