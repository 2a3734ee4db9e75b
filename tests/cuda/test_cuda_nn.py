"""log_softmax, softmax, logsumexp and cross_entropy (the fused
CrossEntropy op and its gradient op) on cuda, and the functional layers
built from ops (batch_norm, dropout): cpu vs cuda, first and second order;
the launches a cross-entropy costs."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.op import OpError

SHAPES_AXES = [((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), -1), ((5,), 0), ((3, 1), 1), ((1, 4), 0), ((), -1),
               ((0, 3), 1), ((3, 0), 0)]
IDS = [f"{list(s)}-axis{a}".replace(" ", "") for s, a in SHAPES_AXES]


def _x(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 2).astype(dtype)


@pytest.mark.parametrize("shape, axis", SHAPES_AXES, ids=IDS)
@pytest.mark.parametrize("fn", [F.log_softmax, F.softmax], ids=["log_softmax", "softmax"])
def test_softmaxes(cuda, matches_cpu, fn, shape, axis):
    matches_cpu(lambda x: fn(x, axis), [_x(shape)])


@pytest.mark.parametrize("fn", [F.log_softmax, F.softmax], ids=["log_softmax", "softmax"])
def test_softmaxes_float64_and_large_values(cuda, matches_cpu, fn):
    x = _x((3, 5), np.float64) * 300           # exp overflows without the max shift
    matches_cpu(lambda x: fn(x, 1), [x], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("shape, axis", [s for s in SHAPES_AXES if 0 not in s[0]],
                         ids=[i for s, i in zip(SHAPES_AXES, IDS) if 0 not in s[0]])
def test_logsumexp(cuda, matches_cpu, shape, axis, keepdims):
    """The fused forward kernel; the backward comes from the decomposition."""
    matches_cpu(lambda x: F.logsumexp(x, axis, keepdims), [_x(shape)])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("fn", [F.log_softmax, F.softmax, F.logsumexp], ids=["log_softmax", "softmax", "logsumexp"])
def test_integer_inputs_promote_as_on_cpu(cuda, matches_cpu, fn, dtype):
    matches_cpu(lambda x: fn(x, 1), [np.arange(6, dtype=dtype).reshape(2, 3) * 3])


@pytest.mark.parametrize("axis, keepdims", [(1, False), (-1, True), (0, False)])
def test_logsumexp_decomposition_runs_on_cuda(cuda, axis, keepdims):
    """The ops LogSumExp's backward graph is derived from, run on cuda."""
    from gradcore.ops.nn import LogSumExp
    op, x = LogSumExp(axis, keepdims), _x((2, 3, 4), np.float64)
    got = op.decompose(gc.Tensor(x, device="cuda"))
    assert got.device == "cuda"
    np.testing.assert_allclose(got.numpy(), op.cpu(x), rtol=1e-12)


def test_logsumexp_of_no_rows(cuda, matches_cpu):
    matches_cpu(lambda x: F.logsumexp(x, 1), [_x((0, 3))])


def test_errors_match_cpu(cuda):
    for device in ("cpu", "cuda"):
        empty = gc.Tensor(np.zeros((2, 0), np.float32), device=device)
        # over an empty axis: -inf, as PyTorch (issue 23), on both devices
        out = F.logsumexp(empty, 1)
        assert out.device == device
        np.testing.assert_array_equal(out.numpy(), [-np.inf, -np.inf])
        x = gc.Tensor(np.zeros((2, 3), np.float32), device=device)
        with pytest.raises(OpError, match="out of range"):
            F.log_softmax(x, 2)


def test_float16_is_a_clear_error(cuda):
    x = gc.Tensor(np.ones((2, 2), np.float16), device="cuda")
    for fn in (F.softmax, F.log_softmax, F.logsumexp):
        with pytest.raises(TypeError, match="no float16 kernels"):
            fn(x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smooth", [0.0, 0.1])
def test_cross_entropy(cuda, matches_cpu, reduction, label_smooth):
    logits = _x((4, 5))
    labels = np.array([0, 4, 2, 2])
    matches_cpu(lambda p, lab: F.cross_entropy(p, lab, label_smooth=label_smooth, reduction=reduction),
                [logits, labels])


def test_cross_entropy_spatial_and_probabilities(cuda, matches_cpu):
    labels = np.array([[0, 2, 1], [1, 1, 0]], np.int32)          # (N, H): classes on axis 1
    matches_cpu(lambda p, lab: F.cross_entropy(p, lab), [_x((2, 3, 3)), labels])
    probs = F.softmax(gc.Tensor(_x((4, 3)))).numpy()
    matches_cpu(lambda p, lab: F.cross_entropy(p, lab, with_logits=False), [probs, np.array([0, 1, 2, 1])])


# pred shape, class axis, label dtype: MegEngine's default axis on (N, C) and (N,
# C, d1, d2) (a thread per row, adjacent threads on adjacent columns), the
# class axis first, last and long (a block per row), a row longer than a block
CE_LAYOUTS = [((6, 5), 1, np.int32), ((2, 3, 4, 2), 1, np.int64), ((4, 3), 0, np.uint8),
              ((3, 2, 40), -1, np.int32), ((2, 300), 1, np.int64), ((2, 2, 3, 5), 2, np.int16)]
CE_IDS = [f"{list(s)}-axis{a}-{np.dtype(d).name}".replace(" ", "") for s, a, d in CE_LAYOUTS]


def _ce_labels(shape, axis, dtype, seed=1):
    ax = axis % len(shape)
    return np.random.default_rng(seed).integers(0, shape[ax], shape[:ax] + shape[ax + 1:]).astype(dtype)


@pytest.mark.parametrize("shape, axis, label_dtype", CE_LAYOUTS, ids=CE_IDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smooth", [0.0, 0.2])
def test_cross_entropy_layouts(cuda, matches_cpu, shape, axis, label_dtype, reduction, label_smooth):
    matches_cpu(lambda p, lab: F.cross_entropy(p, lab, axis=axis, label_smooth=label_smooth, reduction=reduction),
                [_x(shape), _ce_labels(shape, axis, label_dtype)])


@pytest.mark.parametrize("shape, axis", [((3, 5), 1), ((3, 70), 1)], ids=["thread-per-row", "block-per-row"])
def test_cross_entropy_float64_large_and_masked_logits(cuda, matches_cpu, shape, axis):
    x = _x(shape, np.float64) * 300             # exp overflows without the max shift
    x[:, 2] = -np.inf                            # a masked class: probability 0, no NaN
    labels = np.array([0, 1, 3])
    matches_cpu(lambda p, lab: F.cross_entropy(p, lab, reduction="none"), [x, labels], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape, axis", [((4, 5), 1), ((2, 40), 1), ((2, 3, 2), 1)])
@pytest.mark.parametrize("label_smooth", [0.0, 0.1])
def test_cross_entropy_ops_directly(cuda, shape, axis, label_smooth):
    """The two ops' kernels against their NumPy kernels, float64."""
    from gradcore.core import apply
    from gradcore.ops import CrossEntropy, CrossEntropyGrad
    x, labels = _x(shape, np.float64), _ce_labels(shape, axis, np.int64)
    g = _x(labels.shape, np.float64, seed=2)
    for op, ins in ((CrossEntropy(axis, label_smooth), (x, labels)),
                    (CrossEntropyGrad(axis, label_smooth), (x, labels, g))):
        (got,) = apply(op, *[gc.Tensor(a, device="cuda") for a in ins])
        assert got.device == "cuda"
        np.testing.assert_allclose(got.numpy(), op.cpu(*ins), rtol=1e-12, atol=1e-14)


def test_cross_entropy_labels_out_of_range_raise_as_on_cpu(cuda):
    for device in ("cpu", "cuda"):
        x = gc.Tensor(_x((3, 4)), device=device)
        with pytest.raises(IndexError, match=r"^cross_entropy: CrossEntropy\(axis=1, label_smooth=0.0\): label 4 "
                                             r"out of range for 4 classes .*\(3, 4\), \(3,\)"):
            F.cross_entropy(x, gc.Tensor(np.array([0, 4, 1], np.int32), device=device))
    # negative labels: a ValueError on the cpu (checked first), an IndexError from the op on cuda
    with pytest.raises(IndexError, match=r"^cross_entropy: CrossEntropy.*label -1 out of range"):
        F.cross_entropy(gc.Tensor(_x((3, 4)), device="cuda"), gc.Tensor(np.array([0, -1, 1]), device="cuda"))


def test_cross_entropy_grad_kernels_give_nan_for_a_label_out_of_range(cuda):
    """The gradient's labels are the forward's (range-checked there); given
    one out of range directly, the kernels read nothing out of bounds: that
    row is NaN, the others right."""
    from gradcore.core import apply
    from gradcore.ops import CrossEntropyGrad
    for shape in ((3, 4), (3, 50)):
        x, labels, g = _x(shape, np.float64), np.array([0, 9999, 1]), np.ones(3)
        (got,) = apply(CrossEntropyGrad(1), *[gc.Tensor(a, device="cuda") for a in (x, labels, g)])
        got = got.numpy()
        assert np.isnan(got[1]).all()
        ok = np.array([0, 2])
        np.testing.assert_allclose(got[ok], CrossEntropyGrad(1).cpu(x[ok], labels[ok], g[ok]), rtol=1e-12)


def test_cross_entropy_costs_two_launches_each_way(cuda):
    """A (32, 10) batch with reduction "mean": the fused op and the mean
    forward; the mean's backward and the fused gradient backward (the
    composition took 4 and 7)."""
    from gradcore.autodiff import GradManager
    from gradcore.cuda import runtime
    rng = np.random.default_rng(0)
    x = gc.Parameter(rng.standard_normal((32, 10)).astype(np.float32), device="cuda")
    y = gc.Tensor(rng.integers(0, 10, 32).astype(np.int32), device="cuda")
    gm, launcher = GradManager().attach([x]), runtime.backend().launcher
    for _ in range(2):          # the second step: kernels loaded, the labels' range known
        with gm:
            n0 = launcher.launches
            loss = F.cross_entropy(x, y)
            n1 = launcher.launches
            gm.backward(loss)
            n2 = launcher.launches
        x.grad = None
    assert n1 - n0 <= 2, f"forward: {n1 - n0} launches"
    assert n2 - n1 <= 2, f"backward: {n2 - n1} launches"


def test_cross_entropy_kernel_sources_are_built_once(cuda):
    from gradcore.ops import loss
    x = gc.Parameter(_x((8, 5)), device="cuda")
    y = gc.Tensor(np.arange(8) % 5, device="cuda")
    gm = gc.GradManager().attach([x])

    def step():
        with gm:
            gm.backward(F.cross_entropy(x, y, label_smooth=0.1))
        x.grad = None
    step()
    built = loss._ce_source.cache_info().misses
    step()
    assert loss._ce_source.cache_info().misses == built


# ---------------------------------------------------------------- functional layers made of ops
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_training(cuda, matches_cpu, affine):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    if affine:
        w, b = rng.standard_normal((2, 1, 3, 1, 1)).astype(np.float32)
        matches_cpu(lambda x, w, b: F.batch_norm(x, weight=w, bias=b, training=True), [x, w, b], atol=1e-4)
    else:
        matches_cpu(lambda x: F.batch_norm(x, training=True), [x], atol=1e-4)


def test_batch_norm_inference(cuda, matches_cpu):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    mean, var = rng.standard_normal((1, 3)).astype(np.float32), rng.random((1, 3)).astype(np.float32) + 0.5
    matches_cpu(lambda x, m, v: F.batch_norm(x, m, v), [x, mean, var], wrt=[0])


def test_batch_norm_updates_running_statistics_on_cuda(cuda):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    stats = {}
    for device in ("cpu", "cuda"):
        rm = gc.Tensor(np.zeros((1, 3, 1), np.float32), device=device)
        rv = gc.Tensor(np.ones((1, 3, 1), np.float32), device=device)
        y = F.batch_norm(gc.Tensor(x, device=device), rm, rv, training=True)
        assert y.device == device and rm.device == device and rv.device == device
        stats[device] = (y.numpy(), rm.numpy(), rv.numpy())
    for want, got in zip(stats["cpu"], stats["cuda"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_dropout(cuda):
    x = np.ones((4, 50), np.float32)
    assert F.dropout(gc.Tensor(x, device="cuda"), 0.5, training=False).device == "cuda"
    gc.random.seed(3)
    want = F.dropout(gc.Tensor(x), 0.25).numpy()
    gc.random.seed(3)
    y = F.dropout(gc.Tensor(x, device="cuda"), 0.25)
    assert y.device == "cuda"
    np.testing.assert_allclose(y.numpy(), want)       # the same mask: it comes from gradcore.random


def test_dropout_gradients(cuda, matches_cpu):
    def fn(x):
        gc.random.seed(4)           # the same mask on both devices and every call
        return F.dropout(x * x, 0.5)
    matches_cpu(fn, [_x((3, 8))])
