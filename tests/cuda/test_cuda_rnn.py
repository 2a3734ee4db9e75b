"""The recurrent layers' fused ops on cuda (LSTMLayer, LSTMLayerBackward)
against the cpu: values, first and second order gradients, both
directions, float32 and float64, an empty batch; and what a sequence costs
(a GEMM and a kernel per step each way, one GEMM for the recurrent weight's
gradient over every step)."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
from gradcore.core import apply
from gradcore.ops.rnn import LSTMLayer, LSTMLayerBackward, _lstm_layer_cpu


def _layer_inputs(T, B, H, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in ((T, B, 4 * H), (B, H), (B, H))] + \
        [(rng.standard_normal((4 * H, H)) * 0.5).astype(dtype)]


@pytest.mark.parametrize("reverse", [False, True])
def test_lstm_layer_matches_cpu_both_orders(cuda, matches_cpu, reverse):
    matches_cpu(lambda *xs: apply(LSTMLayer(3, reverse), *xs), _layer_inputs(3, 2, 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
def test_lstm_layer_ops_on_cuda_equal_the_cpu_kernels(cuda, dtype, reverse):
    T, B, H = 4, 3, 5
    ins = _layer_inputs(T, B, H, dtype, seed=1)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    outs = apply(LSTMLayer(T, reverse), *[gc.Tensor(a, device="cuda") for a in ins])
    want = _lstm_layer_cpu(reverse, *ins)
    for got, ref in zip(outs, want):
        assert got.device == "cuda" and got.dtype == dtype
        np.testing.assert_allclose(got.numpy(), ref, **tol)
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(a.shape).astype(dtype) for a in want]
    bins = [ins[1], ins[2], ins[3], *want, *grads]
    op = LSTMLayerBackward(T, reverse)
    got = apply(op, *[gc.Tensor(a, device="cuda") for a in bins])
    for g, r in zip(got, op.cpu(*bins)):
        np.testing.assert_allclose(g.numpy(), r, **tol)


def test_lstm_layer_empty_batch(cuda):
    ins = _layer_inputs(2, 0, 3)
    hs, cs, gates = apply(LSTMLayer(2), *[gc.Tensor(a, device="cuda") for a in ins])
    assert hs.shape == (2, 0, 3) and gates.shape == (2, 0, 12)
    bins = [ins[1], ins[2], ins[3]] + [np.zeros(s, np.float32) for s in ((2, 0, 3), (2, 0, 3), (2, 0, 12))] * 2
    dgx, dh0, dc0, dw = apply(LSTMLayerBackward(2), *[gc.Tensor(a, device="cuda") for a in bins])
    assert dgx.shape == (2, 0, 12) and dh0.shape == (0, 3)
    np.testing.assert_array_equal(dw.numpy(), np.zeros((12, 3), np.float32))


def test_lstm_module_on_cuda_matches_cpu(cuda, matches_cpu):
    """A bidirectional two-layer M.LSTM with given states, every output
    (the sequence, h_n, c_n) weighted: gradients of the input and the states."""
    import gradcore.module as M
    m = M.LSTM(3, 4, num_layers=2, bidirectional=True)
    params = {n: p.numpy().copy() for n, p in m.named_parameters()}

    def run(x, h0, c0):
        if x.device != m.weight_ih_l0.device:
            m.to(x.device)
        out, (h, c) = m(x, (h0, c0))
        return out, h, c
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((5, 2, 3), (4, 2, 4), (4, 2, 4))]
    try:
        matches_cpu(run, arrays, second_order=False)
    finally:
        for n, p in m.named_parameters():
            np.testing.assert_array_equal(p.numpy(), params[n])


def test_lstm_layer_costs_a_gemm_and_a_kernel_per_step(cuda, monkeypatch):
    from gradcore.cuda import runtime
    be = runtime.backend()
    T, B, H = 6, 2, 3
    ins = [gc.Tensor(a, device="cuda") for a in _layer_inputs(T, B, H)]
    gm = gc.GradManager().attach(ins)
    gemms, kernels = [], []
    real_gemm, real_launch = be.gemm, be.launch_n
    monkeypatch.setattr(be, "gemm", lambda *a: (gemms.append(a[4]), real_gemm(*a))[1])
    monkeypatch.setattr(be, "launch_n", lambda k, *a: (kernels.append(k.name), real_launch(k, *a))[1])
    for _ in range(2):                  # the second: kernels loaded
        gemms.clear()
        kernels.clear()
        with gm:
            hs, cs, gates = apply(LSTMLayer(T), *ins)
            forward = (len(gemms), [k for k in kernels if "lstmlayer" in k])
            gm.backward(F.sum(hs))
    assert forward == (T, ["gc_lstmlayerstep_float"] * T), "forward: a GEMM and a kernel per step"
    # backward: a kernel and a GEMM per step, and two GEMMs for the recurrent
    # weight's gradient: the first step's, and every other step's in one (k = (T - 1) * B)
    assert [k for k in kernels if "lstmlayer" in k][T:] == ["gc_lstmlayerstepbackward_float"] * T
    assert len(gemms) - T == T + 2 and gemms[-1] == (T - 1) * B
