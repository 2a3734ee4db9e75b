"""nn ops: log_softmax (hand-written VJP), logsumexp (declared only by its
decomposition: the backward graph is derived), softmax, cross_entropy (the
fused CrossEntropy op of ops/loss.py and its gradient op) and linear.
Values and gradients against PyTorch, first and second order gradients
against finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
from gradcore.core import TensorDesc, make_backward_graph
from gradcore.core import apply
from gradcore.ops import CrossEntropy, CrossEntropyGrad, LogSoftmax, LogSumExp
from gradcore.testing import check_op, gradgradcheck

AXES = [((5,), 0), ((3, 4), -1), ((3, 4), 0), ((2, 3, 2), 1), ((1, 1), -1), ((2, 1), 1)]
AX_PARAMS = [pytest.param(s, a, id=f"{list(s)}-ax{a}".replace(" ", "")) for s, a in AXES]


def tnn(torch):
    return torch.nn.functional


# ---- log_softmax / softmax / logsumexp
@pytest.mark.parametrize("shape, axis", AX_PARAMS)
@pytest.mark.parametrize("name", ["log_softmax", "softmax"])
def test_softmax_family(name, shape, axis, rng, h, torch):
    x = rng.standard_normal(shape)
    fn = lambda t: getattr(F, name)(t, axis)
    h.compare(torch, fn, lambda t: getattr(torch, name)(t, axis), [x], rtol=1e-10, atol=1e-12)
    h.check_grads(fn, [x])


@pytest.mark.parametrize("shape, axis", AX_PARAMS)
@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp(shape, axis, keepdims, rng, h, torch):
    x = rng.standard_normal(shape)
    fn = lambda t: F.logsumexp(t, axis, keepdims)
    h.compare(torch, fn, lambda t: torch.logsumexp(t, axis, keepdims), [x], rtol=1e-10, atol=1e-12)
    h.check_grads(fn, [x])


@pytest.mark.parametrize("name", ["log_softmax", "softmax", "logsumexp"])
def test_large_inputs_are_stable(name, h, torch):
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]])
    h.compare(torch, lambda t: getattr(F, name)(t, 1), lambda t: getattr(torch, name)(t, 1), [x],
              rtol=1e-10, atol=1e-12)


def test_logsumexp_backward_is_derived_from_its_decomposition():
    assert not hasattr(LogSumExp, "vjp") and hasattr(LogSumExp, "decompose")
    d = TensorDesc((2, 3), "float64", "cpu")
    graph, mask, has = make_backward_graph(LogSumExp(-1, False), [d], [True], [True])
    assert has == [True]
    assert graph.ops and all(type(op) is not LogSumExp for op in graph.ops)


def test_log_softmax_grad_matches_its_decomposition(rng, h):
    """LogSoftmax carries both a hand VJP and a decomposition: the hand VJP
    must agree with finite differences of the decomposition's forward."""
    x = rng.standard_normal((3, 4))
    op = LogSoftmax(1)
    _, g_hand, w = h.gc_vjp(lambda t: F.log_softmax(t, 1), [x])
    _, g_dec, _ = h.gc_vjp(lambda t: op.decompose(t), [x], weight=w)
    np.testing.assert_allclose(g_hand[0], g_dec[0], rtol=1e-10, atol=1e-12)


def test_softmax_second_order_vs_torch(rng, torch):
    """d/dx sum(v * d/dx sum(w * softmax(x))) against torch's double backward."""
    x, w, v = rng.standard_normal((2, 4)), rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    xt = torch.tensor(x, requires_grad=True)
    (gt,) = torch.autograd.grad((torch.softmax(xt, 1) * torch.tensor(w)).sum(), xt, create_graph=True)
    (ggt,) = torch.autograd.grad((gt * torch.tensor(v)).sum(), xt)

    xg = gradcore.Tensor(x)
    outer = gradcore.GradManager().attach([xg])
    with outer:
        inner = gradcore.GradManager().attach([xg])
        with inner:
            inner.backward(F.sum(F.softmax(xg, 1) * gradcore.Tensor(w)))
        g = xg.grad
        xg.grad = None
        outer.backward(F.sum(g * gradcore.Tensor(v)))
    np.testing.assert_allclose(g.numpy(), gt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xg.grad.numpy(), ggt.numpy(), rtol=1e-10, atol=1e-12)


# ---- cross_entropy
CE_CASES = [
    pytest.param((4, 3), dict(), id="mean"),
    pytest.param((4, 3), dict(reduction="sum"), id="sum"),
    pytest.param((4, 3), dict(reduction="none"), id="none"),
    pytest.param((1, 5), dict(), id="one-sample"),
    pytest.param((2, 3, 2), dict(), id="spatial-mean"),
    pytest.param((2, 3, 2), dict(reduction="none"), id="spatial-none"),
    pytest.param((4, 3), dict(label_smooth=0.1), id="label-smooth"),
    pytest.param((4, 3), dict(label_smooth=0.2, reduction="sum"), id="label-smooth-sum"),
]


def _labels(shape, rng):
    return rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int32)


def _torch_ce(torch, kw):
    return lambda p, y: tnn(torch).cross_entropy(p, y, reduction=kw.get("reduction", "mean"),
                                                 label_smoothing=kw.get("label_smooth", 0.0))


@pytest.mark.parametrize("shape, kw", CE_CASES)
def test_cross_entropy(shape, kw, rng, h, torch):
    pred, label = rng.standard_normal(shape), _labels(shape, rng)
    fn = lambda p, y: F.cross_entropy(p, y, **kw)
    h.compare(torch, fn, _torch_ce(torch, kw), [pred, label], rtol=1e-10, atol=1e-12)
    h.check_grads(lambda p: fn(p, gradcore.Tensor(label)), [pred])


def test_cross_entropy_with_probabilities(rng, h, torch):
    shape = (4, 3)
    p = rng.uniform(0.2, 1.0, shape)
    p = p / p.sum(1, keepdims=True)
    label = _labels(shape, rng)
    fn = lambda t, y: F.cross_entropy(t, y, with_logits=False)
    h.compare(torch, fn, lambda t, y: tnn(torch).nll_loss(torch.log(t), y), [p, label])
    h.check_grads(lambda t: fn(t, gradcore.Tensor(label)), [p])


def test_cross_entropy_bad_arguments(h):
    pred = gradcore.Tensor(np.zeros((4, 3)))
    with pytest.raises(TypeError, match="cross_entropy: label must hold whole class indices"):
        F.cross_entropy(pred, gradcore.Tensor([0.0, 1.5, 2.0, 0.0]))
    with pytest.raises(TypeError, match="cross_entropy: label must be an integer tensor, got bool"):
        F.cross_entropy(pred, gradcore.Tensor(np.zeros(4, bool)))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(pred, gradcore.Tensor(np.zeros(4, np.int32)), reduction="avg")
    with pytest.raises(ValueError) as ei:
        F.cross_entropy(pred, gradcore.Tensor(np.zeros(3, np.int32)))
    h.check_error(ei, "cross_entropy", "CrossEntropy", "(4, 3)", "(3,)")


def test_float_labels_holding_class_indices_are_accepted(rng, torch):
    # MegEngine casts float labels to int32 (its documentation passes float ones)
    logits = rng.standard_normal((4, 3))
    labels = np.array([0, 2, 1, 2])
    expect = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels)).item()
    got = F.cross_entropy(gradcore.Tensor(logits), gradcore.Tensor(labels.astype(np.float32))).item()
    assert got == pytest.approx(expect, rel=1e-12)
    picked = F.indexing_one_hot(gradcore.Tensor(logits), gradcore.Tensor(labels.astype(np.float64)))
    np.testing.assert_array_equal(picked.numpy(), logits[np.arange(4), labels])



# ---- the fused cross-entropy ops (ops/loss.py)
# pred shape, class axis: (N, C), (N, C, d1, d2) with MegEngine's default axis
# 1, the class axis last, first, and in the middle of a 4-d input
CE_LAYOUTS = [((5, 4), 1), ((2, 3, 4, 2), 1), ((3, 2, 6), -1), ((4, 3), 0), ((2, 2, 3, 5), 2)]
CE_LAYOUT_IDS = [f"{list(s)}-ax{a}".replace(" ", "") for s, a in CE_LAYOUTS]


def _ce_labels(shape, axis, rng, dtype=np.int64):
    ax = axis % len(shape)
    return rng.integers(0, shape[ax], shape[:ax] + shape[ax + 1:]).astype(dtype)


def _torch_ce_along(torch, axis, reduction, label_smooth):
    """PyTorch's cross_entropy with the classes on ``axis`` (moved to 1, where
    PyTorch wants them; the other axes keep their order, as the label's)."""
    return lambda p, y: tnn(torch).cross_entropy(torch.movedim(p, axis, 1), y, reduction=reduction,
                                                 label_smoothing=label_smooth)


@pytest.mark.parametrize("shape, axis", CE_LAYOUTS, ids=CE_LAYOUT_IDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smooth", [0.0, 0.15])
def test_cross_entropy_layouts_vs_torch(shape, axis, reduction, label_smooth, rng, h, torch):
    pred, label = rng.standard_normal(shape) * 2, _ce_labels(shape, axis, rng)
    fn = lambda p, y: F.cross_entropy(p, y, axis=axis, label_smooth=label_smooth, reduction=reduction)
    h.compare(torch, fn, _torch_ce_along(torch, axis, reduction, label_smooth), [pred, label],
              rtol=1e-10, atol=1e-12, need_grads=True)


@pytest.mark.parametrize("shape, axis", CE_LAYOUTS, ids=CE_LAYOUT_IDS)
@pytest.mark.parametrize("label_smooth", [0.0, 0.2])
def test_cross_entropy_grads_of_both_orders(shape, axis, label_smooth, rng, h):
    """First and second order against float64 finite differences."""
    pred, label = rng.standard_normal(shape), gradcore.Tensor(_ce_labels(shape, axis, rng))
    h.check_grads(lambda p: F.cross_entropy(p, label, axis=axis, label_smooth=label_smooth, reduction="sum"),
                  [pred])


@pytest.mark.parametrize("label_smooth", [0.0, 0.1])
def test_cross_entropy_second_order_vs_torch(label_smooth, rng, torch):
    """d/dx sum(v * d/dx cross_entropy(x)) on (N, C, d1, d2) against torch's
    double backward (the third order goes through the derived backward too)."""
    shape, axis = (2, 3, 2, 2), 1
    x, label = rng.standard_normal(shape), _ce_labels(shape, axis, rng)
    v = rng.standard_normal(shape)
    xt = torch.tensor(x, requires_grad=True)
    (gt,) = torch.autograd.grad(tnn(torch).cross_entropy(xt, torch.tensor(label), label_smoothing=label_smooth),
                                xt, create_graph=True)
    (ggt,) = torch.autograd.grad((gt * torch.tensor(v)).sum(), xt)
    xg = gradcore.Tensor(x)
    outer = gradcore.GradManager().attach([xg])
    with outer:
        inner = gradcore.GradManager().attach([xg])
        with inner:
            inner.backward(F.cross_entropy(xg, gradcore.Tensor(label), label_smooth=label_smooth))
        g = xg.grad
        xg.grad = None
        outer.backward(F.sum(g * gradcore.Tensor(v)))
    np.testing.assert_allclose(g.numpy(), gt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xg.grad.numpy(), ggt.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [CrossEntropy, CrossEntropyGrad])
def test_cross_entropy_ops_pass_check_op(cls):
    """Their examples() (what ``gradcore check`` runs): values, float32 vs
    float64, infer, first and second order gradients, bad shapes."""
    check_op(cls).raise_on_failure()


def test_cross_entropy_runs_as_one_op_and_its_backward_as_one_more():
    d = TensorDesc((4, 3), "float64", "cpu")
    label = TensorDesc((4,), "int64", "cpu")
    graph, save, has = make_backward_graph(CrossEntropy(1), [d, label], [True, False], [True])
    assert [type(op) for op in graph.ops] == [CrossEntropyGrad]
    assert has == [True, False]
    assert save == [True, True, False, True]      # pred, label and the output grad; not the loss
    # the gradient op's own backward is derived from its decomposition
    assert not hasattr(CrossEntropyGrad, "vjp") and hasattr(CrossEntropyGrad, "decompose")
    graph, _, has = make_backward_graph(CrossEntropyGrad(1), [d, label, TensorDesc((4,), "float64", "cpu")],
                                        [True, False, True], [True])
    assert has == [True, False, True]
    assert graph.ops and CrossEntropyGrad not in {type(op) for op in graph.ops}


@pytest.mark.parametrize("label_smooth", [0.0, 0.3])
@pytest.mark.parametrize("shape, axis", CE_LAYOUTS, ids=CE_LAYOUT_IDS)
def test_cross_entropy_kernels_match_their_decompositions(shape, axis, label_smooth, rng):
    pred, label = rng.standard_normal(shape), _ce_labels(shape, axis, rng)
    g = rng.standard_normal(label.shape)
    op, grad_op = CrossEntropy(axis, label_smooth), CrossEntropyGrad(axis, label_smooth)
    p, y, gt = gradcore.Tensor(pred), gradcore.Tensor(label), gradcore.Tensor(g)
    np.testing.assert_allclose(apply(op, p, y)[0].numpy(), op.decompose(p, y).numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(apply(grad_op, p, y, gt)[0].numpy(), grad_op.decompose(p, y, gt).numpy(),
                               rtol=1e-12, atol=1e-13)


def test_cross_entropy_of_masked_logits_is_finite(h, torch):
    """Classes scored -inf (masked) get probability 0: a finite loss and
    gradient, as PyTorch's (no 0 * -inf from the smoothing term when there
    is none)."""
    x = np.array([[0.5, -np.inf, 1.0], [-np.inf, 2.0, 0.0]])
    label = np.array([2, 1])
    h.compare(torch, lambda p, y: F.cross_entropy(p, y, reduction="none"),
              lambda p, y: tnn(torch).cross_entropy(p, y, reduction="none"), [x, label], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int16])
def test_cross_entropy_label_dtypes(dtype, rng, torch):
    pred, label = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    expect = tnn(torch).cross_entropy(torch.tensor(pred), torch.tensor(label)).item()
    assert F.cross_entropy(gradcore.Tensor(pred), gradcore.Tensor(label.astype(dtype))).item() == \
        pytest.approx(expect, rel=1e-12)


def test_cross_entropy_of_integer_scores_takes_the_composed_path(torch):
    scores, label = np.array([[1, 3, 0], [2, 2, 5]], np.int32), np.array([1, 2])
    expect = tnn(torch).cross_entropy(torch.tensor(scores, dtype=torch.float64), torch.tensor(label)).item()
    assert F.cross_entropy(gradcore.Tensor(scores), gradcore.Tensor(label)).item() == pytest.approx(expect, rel=1e-6)


@pytest.mark.parametrize("record", [False, True])
def test_cross_entropy_label_out_of_range_names_the_function_and_shapes(record):
    pred = gradcore.Tensor(np.zeros((3, 4)))
    gm = gradcore.GradManager().attach([pred])
    if record:
        gm.record()
    try:
        with pytest.raises(IndexError, match=r"^cross_entropy: CrossEntropy\(axis=1, label_smooth=0.0\): label 4 "
                                             r"out of range for 4 classes along axis 1 .*\(3, 4\), \(3,\)"):
            F.cross_entropy(pred, gradcore.Tensor(np.array([0, 4, 2])))
    finally:
        gm.release()


def test_cross_entropy_op_errors_name_it():
    pred, label = gradcore.Tensor(np.zeros((3, 4))), gradcore.Tensor(np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"CrossEntropy\(axis=1.*pred must be floating-point"):
        apply(CrossEntropy(1), gradcore.Tensor(np.zeros((3, 4), np.int32)), label)
    with pytest.raises(ValueError, match=r"CrossEntropy\(axis=1.*label must be an integer tensor"):
        apply(CrossEntropy(1), pred, gradcore.Tensor(np.zeros(3)))
    with pytest.raises(ValueError, match=r"CrossEntropy\(axis=2.*axis 2 is out of range for 2 dimensions"):
        apply(CrossEntropy(2), pred, label)
    with pytest.raises(IndexError, match=r"CrossEntropy\(axis=1.*label -1 out of range"):
        apply(CrossEntropy(1), pred, gradcore.Tensor(np.array([0, -1, 2])))
    with pytest.raises(ValueError, match=r"CrossEntropyGrad\(axis=1.*the gradient must have shape \(3,\)"):
        apply(CrossEntropyGrad(1), pred, label, gradcore.Tensor(np.zeros(4)))
    with pytest.raises(TypeError, match="CrossEntropy: label_smooth must be a number"):
        CrossEntropy(1, "0.1")

# ---- linear
LIN_CASES = [
    pytest.param((2, 3), (4, 3), (4,), id="2d-bias"),
    pytest.param((2, 3), (4, 3), None, id="2d"),
    pytest.param((5, 2, 3), (4, 3), (4,), id="batched-bias"),
    pytest.param((3,), (4, 3), (4,), id="1d-bias"),
    pytest.param((2, 3), (1, 3), (1,), id="one-out"),
]


@pytest.mark.parametrize("xs, ws, bs", LIN_CASES)
def test_linear(xs, ws, bs, rng, h, torch):
    arrays = [rng.standard_normal(s) for s in (xs, ws) + ((bs,) if bs else ())]
    h.compare(torch, F.linear, tnn(torch).linear, arrays, rtol=1e-10, atol=1e-12)
    h.check_grads(lambda *t: F.linear(*t) ** 2, arrays)


# ---- dtypes
DTYPE_FNS = [
    pytest.param(lambda t: F.log_softmax(t, 1), id="log_softmax"),
    pytest.param(lambda t: F.softmax(t, 1), id="softmax"),
    pytest.param(lambda t: F.logsumexp(t, 1), id="logsumexp"),
    pytest.param(lambda t: F.cross_entropy(t, gradcore.Tensor(np.array([0, 2, 1]))), id="cross_entropy"),
    pytest.param(lambda t: F.linear(t, t[:2] * 1.0, t[0, :2] * 1.0), id="linear"),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fn", DTYPE_FNS)
def test_dtype(fn, dtype, rng, h):
    x = rng.standard_normal((3, 3)).astype(dtype)
    out, grads, _ = h.gc_vjp(fn, [x])
    assert out.dtype == np.dtype(dtype) and grads[0].dtype == np.dtype(dtype)
    out64, grads64, _ = h.gc_vjp(fn, [x.astype(np.float64)])
    np.testing.assert_allclose(out, out64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[0], grads64[0].astype(dtype) if dtype == "float32" else grads64[0],
                               rtol=1e-4, atol=1e-4)


# ---- bad input
@pytest.mark.parametrize("fn, name", [
    (lambda x: F.log_softmax(x, 2), "LogSoftmax"),
    (lambda x: F.softmax(x, -3), "Softmax"),
    (lambda x: F.logsumexp(x, 2), "LogSumExp"),
])
@pytest.mark.parametrize("record", [False, True])
def test_bad_axis(fn, name, record, h):
    ei = h.error_of(fn, gradcore.Tensor(np.ones((2, 3))), record)
    h.check_error(ei, name, "(2, 3)", "axis")


def test_linear_shape_mismatch(h):
    with pytest.raises(ValueError) as ei:
        F.linear(gradcore.Tensor(np.ones((2, 3))), gradcore.Tensor(np.ones((4, 2))))
    h.check_error(ei, "MatrixMul", "(2, 3)", "(4, 2)")


def test_leaky_relu_matches_torch_and_differentiates(torch):
    import gradcore.functional as F
    from gradcore.testing import gradcheck, gradgradcheck
    x = np.array([-2.0, -0.5, 0.3, 1.7])
    y = F.leaky_relu(gradcore.Tensor(x), 0.2).numpy()
    np.testing.assert_allclose(y, torch.nn.functional.leaky_relu(torch.tensor(x), 0.2).numpy())
    assert gradcheck(lambda t: F.leaky_relu(t, 0.2), [x])
    assert gradgradcheck(lambda t: F.leaky_relu(t, 0.2) * t, [x])


# ---- MegEngine's defaults and forms
@pytest.mark.parametrize("shape, axis", [((5,), 0), ((3, 4), 1), ((2, 3, 4), 0), ((2, 3, 4, 5), 1)])
def test_softmax_default_axis_is_megengines(shape, axis, rng, h, torch):
    # MegEngine (and PyTorch's implicit dim): 0 for 0-, 1- and 3-d inputs, else 1
    x = rng.standard_normal(shape)
    h.compare(torch, lambda t: F.softmax(t), lambda t: torch.softmax(t, axis), [x], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("axis", [(0, 2), [2, -3], (1,), None])
@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_over_several_axes(axis, keepdims, rng, h, torch):
    x = rng.standard_normal((2, 3, 4))
    taxis = (0, 1, 2) if axis is None else tuple(axis)
    fn = lambda t: F.logsumexp(t, axis, keepdims)
    h.compare(torch, fn, lambda t: torch.logsumexp(t, taxis, keepdims), [x], rtol=1e-10, atol=1e-12)
    h.check_grads(fn, [x])


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsoftmax"])
def test_softmax_family_over_several_axes(name, rng, h, torch):
    x = rng.standard_normal((2, 3, 4))
    ref = lambda t: torch.log_softmax(t.reshape(2, 12), 1).reshape(2, 3, 4)
    tfn = (lambda t: torch.exp(ref(t))) if name == "softmax" else ref
    fn = lambda t: getattr(F, name)(t, [1, 2])
    h.compare(torch, fn, tfn, [x], rtol=1e-10, atol=1e-12)
    h.check_grads(fn, [x])
    assert F.nn.logsoftmax is F.logsoftmax


def test_logsumexp_of_infinities_is_infinite(h, torch):
    # max is shifted by 0 where it is infinite: no inf - inf (PyTorch's values)
    x = np.array([[0.0, -np.inf, 1.0], [np.inf, 0.0, 1.0]])
    for fn, tfn in [(lambda t: F.logsumexp(t, 1), lambda t: torch.logsumexp(t, 1)),
                    (lambda t: F.logsumexp(t, (0, 1), True), lambda t: torch.logsumexp(t, (0, 1), True))]:
        h.assert_close(fn(gradcore.Tensor(x)).numpy(), tfn(torch.tensor(x)).numpy())
    with np.errstate(divide="ignore"):      # log(0): the sum over a row of -inf
        y = F.logsumexp(gradcore.Tensor(np.full((2, 3), -np.inf)), 1).numpy()
    np.testing.assert_array_equal(y, [-np.inf, -np.inf])
    # finite entries next to a -inf still get softmax's gradient
    h.compare(torch, lambda t: F.logsumexp(t, 1), lambda t: torch.logsumexp(t, 1), [x[:1]])


def test_cross_entropy_label_rank_is_checked(h):
    pred = gradcore.Tensor(np.zeros((4, 3)))
    with pytest.raises(ValueError) as ei:
        F.cross_entropy(pred, gradcore.Tensor(np.zeros((4, 1), np.int32)))
    h.check_error(ei, "cross_entropy", "(4, 3)", "(4, 1)")


def test_cross_entropy_refuses_negative_labels():
    pred = gradcore.Tensor(np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"cross_entropy: labels must be class indices >= 0, got -1 "
                                         r"\(label shape \(3,\), pred shape \(3, 4\)\)"):
        F.cross_entropy(pred, gradcore.Tensor(np.array([0, -1, 2])))
