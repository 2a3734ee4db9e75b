"""The convolution with its ReLU as one op (issue 25, item 1: fused
post-ops): ``F.conv2d(..., nonlinear_mode="relu")``, ``M.ConvRelu2d``
(MegEngine's) and the Convolution op of any dimension record one node whose forward
applies ReLU after the bias (on oneDNN a post-op of the primitive) and whose
backward masks the output gradient where the output is not positive, as
``F.relu`` does. Values and gradients against PyTorch (float64 and float32
on both CPU paths), both orders against finite differences and torch's
double backward, the recorded ops, a bias the op does not take, errors."""
from __future__ import annotations

import numpy as np
import pytest

import gradcore
import gradcore.functional as F
import gradcore.module as M
from gradcore import _core
from gradcore.autodiff import GradManager
from gradcore.cpu import onednn
from gradcore.ops import Convolution, Elemwise
from gradcore.testing import check_op

from oracle import compare_second_order

TOL = dict(rtol=1e-10, atol=1e-12)
CASES = {  # n spatial axes, x, weight, stride, padding, groups
    "1d": (1, (2, 3, 9), (4, 3, 3), 1, 1, 1),
    "2d": (2, (2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1),
    "2d-strided-grouped": (2, (2, 4, 7, 7), (6, 2, 3, 2), 2, 1, 2),
    "3d": (3, (1, 2, 4, 5, 4), (3, 2, 2, 3, 2), 1, 1, 1),
}


def _relu_conv(n, stride, padding, groups):
    """The fused op (F.conv2d's nonlinear_mode for 2-d, the op itself for any n)."""
    if n == 2:
        return lambda x, w, b=None: F.conv2d(x, w, b, stride, padding, 1, groups, nonlinear_mode="relu")
    op = Convolution((stride,) * n, (padding,) * n, 1, groups, nonlinear_mode="relu")
    return lambda *t: _core.apply(op, *t)[0]


def _fns(torch, case, bias=True):
    n, _, _, stride, padding, groups = CASES[case]
    t = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[n]
    g = _relu_conv(n, stride, padding, groups)
    if bias:
        return (lambda x, w, b: g(x, w, b)), (lambda x, w, b: torch.relu(t(x, w, b, stride, padding, 1, groups)))
    return (lambda x, w: g(x, w)), (lambda x, w: torch.relu(t(x, w, None, stride, padding, 1, groups)))


def _arrays(rng, case, dtype=np.float64, bias=True):
    _, xs, ws, *_ = CASES[case]
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws)] + ([rng.standard_normal(ws[0])] if bias else [])
    return [a.astype(dtype) for a in arrays]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_gradients_vs_torch(case, bias, rng, h, torch):
    gfn, tfn = _fns(torch, case, bias)
    h.compare(torch, gfn, tfn, _arrays(rng, case, bias=bias), need_grads=True, **TOL)


@pytest.mark.parametrize("path", ["oneDNN", "NumPy"])
@pytest.mark.parametrize("case", ["2d", "2d-strided-grouped", "3d"])
def test_float32_on_both_cpu_paths(case, path, rng, h, torch, monkeypatch):
    if path == "oneDNN" and onednn.why_not() is not None:
        pytest.skip(f"oneDNN: {onednn.why_not()}")
    monkeypatch.setattr(onednn, "enabled", path == "oneDNN")
    gfn, tfn = _fns(torch, case)
    h.compare(torch, gfn, tfn, _arrays(rng, case, np.float32), need_grads=True, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", ["1d", "2d-strided-grouped", "3d"])
def test_second_order_vs_torch_double_backward(case, rng, torch):
    gfn, tfn = _fns(torch, case)
    compare_second_order(torch, lambda *t: gfn(*t) ** 2, lambda *t: tfn(*t) ** 2, _arrays(rng, case), rng)


@pytest.mark.parametrize("case", ["1d", "2d-strided-grouped"])
def test_both_orders_against_finite_differences(case, rng, h):
    n, xs, ws, stride, padding, groups = CASES[case]
    # a positive bias keeps the outputs away from ReLU's kink, where differences are one-sided
    g = _relu_conv(n, stride, padding, groups)
    fn = lambda x, w, b: F.tanh(g(x, w, b))
    h.check_grads(fn, [rng.standard_normal(xs), rng.standard_normal(ws) * 0.1, rng.uniform(1, 2, ws[0])],
                  dtype=np.float64)


def _recorded_ops(y):
    (record,) = _core._recorded_graph(y, ())
    return [node[1] for node in record[2]]


def test_conv_relu_module_records_one_op_and_equals_conv_then_relu(rng):
    gradcore.random.seed(3)
    fused = M.ConvRelu2d(3, 4, 3, padding=1)
    plain = M.Conv2d(3, 4, 3, padding=1)
    plain.load_state_dict(fused.state_dict())
    assert sorted(k for k, _ in fused.named_parameters()) == ["bias", "weight"]
    x = gradcore.tensor(rng.standard_normal((2, 3, 6, 5)).astype("float32"))
    results = []
    for m, relu in ((fused, False), (plain, True)):
        gm = GradManager().attach(m.parameters())
        with gm:
            y = F.relu(m(x)) if relu else m(x)
            ops = _recorded_ops(y)
            gm.backward((y * y).sum())
        results.append((y.numpy(), m.weight.grad.numpy(), m.bias.grad.numpy(), [type(o) for o in ops]))
    assert results[0][3] == [Convolution] and results[1][3] == [Convolution, Elemwise]
    for a, b in zip(results[0][:3], results[1][:3]):
        np.testing.assert_array_equal(a, b)         # the same arithmetic, bit for bit


def test_a_bias_the_op_does_not_take_gets_relu_after_it(rng, torch):
    # a per-element bias is a broadcast add after the op: ReLU must follow it
    x, w = rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal((1, 4, 5, 5))
    y = F.conv2d(gradcore.tensor(x), gradcore.tensor(w), gradcore.tensor(b), padding=1, nonlinear_mode="relu")
    want = torch.relu(torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1) + torch.tensor(b))
    np.testing.assert_allclose(y.numpy(), want.numpy(), **TOL)


def test_check_op_passes_with_the_relu_example():
    assert any(op.nonlinear_mode == "relu" for op, _ in Convolution.examples())
    check_op(Convolution)


def test_bad_nonlinear_mode_is_named():
    with pytest.raises(ValueError, match="nonlinear_mode must be one of identity, relu, got 'sigmoid'"):
        Convolution(1, 1, nonlinear_mode="sigmoid")
    x = gradcore.tensor(np.zeros((1, 1, 3, 3), "float32"))
    with pytest.raises(ValueError, match="conv2d: nonlinear_mode must be one of"):
        F.conv2d(x, x, nonlinear_mode="tanh")


def test_cuda_kernels_on_the_emulator_match_the_cpu(emulated_cuda, rng):
    arrays = _arrays(rng, "2d", np.float32)
    results = {}
    for dev in ("cpu", "cuda"):
        xs = [gradcore.tensor(a, device=dev) for a in arrays]
        gm = GradManager().attach(xs)
        with gm:
            y = F.conv2d(*xs, padding=1, nonlinear_mode="relu")
            gm.backward((y * y).sum())
        results[dev] = [y.numpy()] + [x.grad.numpy() for x in xs]
    assert (results["cpu"][0] == 0).any() and (results["cpu"][0] > 0).any()
    for a, b in zip(results["cpu"], results["cuda"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
