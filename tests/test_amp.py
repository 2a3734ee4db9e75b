"""gradcore.amp: autocast's dtypes per op kind (MegEngine's rules), its
values and gradients against PyTorch's float16 ops, its global state, and
GradScaler's scaling, unscaling, inf/NaN skipping and factor updates."""
import numpy as np
import pytest
import torch

import gradcore as gc
import gradcore.amp as amp
import gradcore.functional as F
import gradcore.module as M
from gradcore.autodiff import GradManager


@pytest.fixture(autouse=True)
def _amp_off():
    yield
    amp.enabled = False
    amp.low_prec_dtype, amp.high_prec_dtype = "float16", "float32"


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_matmul_and_linear_are_float16_with_float32_gradients_as_torch():
    a, w, b = _rand(4, 64), _rand(8, 64, seed=1), _rand(8, seed=2)
    x, wt, bt = gc.tensor(a), gc.Parameter(w), gc.Parameter(b)
    gm = GradManager().attach([x, wt, bt])
    with amp.autocast(), gm:
        p = F.matmul(x, wt, transpose_b=True)
        y = F.linear(x, wt, bt)
        gm.backward((y ** 2).sum())
    # the product in float16; MegEngine's linear casts the bias to float16 too
    # under autocast (functional/nn.py: bias.astype("float16")), so the sum is float16
    assert p.dtype == np.float16 and y.dtype == np.float16
    assert x.grad.dtype == wt.grad.dtype == bt.grad.dtype == np.float32
    # PyTorch: torch.autocast's linear (float16, its float16 CPU GEMM with float32 accumulation)
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (a, w, b))
    with torch.autocast("cpu", dtype=torch.float16):
        ref = torch.nn.functional.linear(tx, tw, tb)
    assert ref.dtype == torch.float16
    np.testing.assert_allclose(y.numpy().astype(np.float32), ref.float().detach().numpy(), rtol=2e-3, atol=2e-2)
    np.testing.assert_array_equal(p.numpy(), torch.nn.functional.linear(tx.half(), tw.half()).detach().numpy())
    (ref.float() ** 2).sum().backward()
    for g, tg in ((x.grad, tx.grad), (wt.grad, tw.grad), (bt.grad, tb.grad)):
        np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-2, atol=5e-2)


def test_float16_matmul_accumulates_in_float32():
    # 4096 ones plus a small value: a float16 running sum stops at 2048, a float32 one does not
    a = np.ones((1, 4096), np.float16)
    b = np.ones((4096, 1), np.float16)
    y = F.matmul(gc.tensor(a), gc.tensor(b))
    assert y.dtype == np.float16
    ref = torch.from_numpy(a) @ torch.from_numpy(b)
    assert y.numpy()[0, 0] == ref.numpy()[0, 0] == 4096


def test_conv2d_and_transpose_are_float16_conv3d_is_not():
    x, w = gc.tensor(_rand(1, 3, 8, 8)), gc.tensor(_rand(4, 3, 3, 3, seed=1))
    with amp.autocast():
        y = F.conv2d(x, w, padding=1)
        t = F.conv_transpose2d(x, gc.tensor(_rand(3, 2, 3, 3, seed=2)))
        c1 = F.conv1d(gc.tensor(_rand(1, 3, 8)), gc.tensor(_rand(4, 3, 3, seed=3)))
        c3 = F.conv3d(gc.tensor(_rand(1, 2, 4, 4, 4)), gc.tensor(_rand(2, 2, 3, 3, 3, seed=4)))
    assert (y.dtype, t.dtype, c1.dtype, c3.dtype) == (np.float16, np.float16, np.float16, np.float32)
    ref = torch.nn.functional.conv2d(torch.tensor(x.numpy()).half().float(),
                                     torch.tensor(w.numpy()).half().float(), padding=1)
    np.testing.assert_allclose(y.numpy().astype(np.float32), ref.numpy(), rtol=1e-2, atol=1e-2)


def test_elementwise_ops_by_kind():
    h = gc.tensor(np.array([0.5, 1.5], np.float16))
    f = gc.tensor(np.array([1.0, 2.0], np.float32))
    with amp.autocast():
        assert F.exp(h).dtype == np.float32            # MegEngine: exp, log, div, pow, sqrt ... in float32
        assert F.log(h).dtype == np.float32
        assert (h / h).dtype == np.float32
        assert (h ** 2).dtype == np.float32
        assert F.sqrt(h).dtype == np.float32
        assert F.softmax(h).dtype == np.float32
        logits = gc.tensor(np.array([[0.5, 1.5], [2.0, -1.0]], np.float16))
        loss = F.nn.cross_entropy(logits, gc.tensor([1, 0]))      # integer labels left alone
        assert loss.dtype == np.float32
        ref = torch.nn.functional.cross_entropy(torch.tensor(logits.numpy()).float(), torch.tensor([1, 0]))
        np.testing.assert_allclose(loss.numpy(), ref.numpy(), rtol=1e-6)
        assert F.relu(h).dtype == np.float16           # the others keep their inputs' dtypes
        assert (h * h).dtype == np.float16
        assert (h + f).dtype == np.float32
        np.testing.assert_allclose(F.exp(h).numpy(), np.exp(np.float32([0.5, 1.5])), rtol=1e-6)
    assert F.exp(h).dtype == np.float16                # off again


def test_norms_under_autocast():
    x = gc.tensor(_rand(2, 3, 4, 4))
    w, b = gc.tensor(np.full((1, 3, 1, 1), 2.0, np.float32)), gc.tensor(np.full((1, 3, 1, 1), 0.5, np.float32))
    with amp.autocast():
        y = F.batch_norm(x, weight=w, bias=b, training=True)
        ln = F.nn.layer_norm(x.astype("float16"), (4, 4), affine=False)
        gn = F.nn.group_norm(x.astype("float16"), 1, affine=False)
    # MegEngine: the input in float16, the statistics in float32, the output in float16
    assert y.dtype == np.float16 and ln.dtype == np.float32 and gn.dtype == np.float32
    ref = torch.nn.functional.batch_norm(torch.tensor(x.numpy()).half().float(), None, None,
                                         torch.full((3,), 2.0), torch.full((3,), 0.5), training=True)
    np.testing.assert_allclose(y.numpy().astype(np.float32), ref.half().float().numpy(), rtol=1e-3, atol=2e-3)


def test_batch_norm_keeps_its_inputs_dtype_without_autocast():
    # MegEngine's BatchNorm: float16 input, float32 parameters -> float16
    x = _rand(2, 3, 4, 4).astype(np.float16)
    w, b = np.float32([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1), np.float32([0.0, 1.0, -1.0]).reshape(1, 3, 1, 1)
    y = F.batch_norm(gc.tensor(x), weight=gc.tensor(w), bias=gc.tensor(b), training=True)
    assert y.dtype == np.float16
    ref = torch.nn.functional.batch_norm(torch.from_numpy(x).float(), None, None, torch.from_numpy(w.ravel()),
                                         torch.from_numpy(b.ravel()), training=True)
    np.testing.assert_allclose(y.numpy().astype(np.float32), ref.numpy(), rtol=2e-3, atol=4e-3)


def test_module_training_step_under_autocast_matches_float32_closely():
    rng = np.random.default_rng(0)
    net = M.Sequential(M.Conv2d(3, 4, 3, padding=1), M.BatchNorm2d(4), M.ReLU())
    x = gc.tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    grads = []
    for on in (False, True):
        gm = GradManager().attach(net.parameters())
        with amp.autocast(enabled=on), gm:
            out = net(x)
            gm.backward(out.astype("float32").mean())
        assert out.dtype == (np.float16 if on else np.float32)
        grads.append([p.grad.numpy().copy() for p in net.parameters()])
        for p in net.parameters():
            p.grad = None
    for g32, g16 in zip(*grads):
        assert g16.dtype == np.float32
        np.testing.assert_allclose(g16, g32, rtol=5e-2, atol=5e-3)


def test_state_properties_nesting_and_decorator():
    assert amp.enabled is False and amp.low_prec_dtype == "float16" and amp.high_prec_dtype == "float32"
    with amp.autocast(low_prec_dtype="float16", high_prec_dtype="float64"):
        assert amp.enabled and amp.high_prec_dtype == "float64"
        assert F.exp(gc.tensor([1.0])).dtype == np.float64
        with amp.autocast(enabled=False):          # changes nothing, as in MegEngine
            assert amp.enabled
    assert amp.enabled is False and amp.high_prec_dtype == "float32"
    amp.enabled = True
    assert F.matmul(gc.tensor([[1.0]]), gc.tensor([[2.0]])).dtype == np.float16
    amp.enabled = False
    assert F.matmul(gc.tensor([[1.0]]), gc.tensor([[2.0]])).dtype == np.float32

    @amp.autocast()
    def f(a):
        return F.matmul(a, a)
    assert f(gc.tensor([[3.0]])).dtype == np.float16 and amp.enabled is False
    with pytest.raises(TypeError, match="low_prec_dtype"):
        amp.autocast(low_prec_dtype="int8")
    with pytest.raises(TypeError, match="high_prec_dtype"):
        amp.high_prec_dtype = "bool"


def _scaled_step(scaler, x, fn, **kw):
    gm = GradManager().attach([x])
    with gm:
        scaler.backward(gm, fn(x), **kw)


def test_grad_scaler_scales_and_unscales():
    scaler = amp.GradScaler()
    x = gc.Parameter(_rand(2, 3))
    _scaled_step(scaler, x, lambda t: (2 * t + 1).sum(), unscale_grad=False)
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2 * 16.0, np.float32))
    scaler.unscale([x])
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0, np.float32))
    x.grad = None
    _scaled_step(scaler, x, lambda t: (t * t).sum())
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy(), rtol=1e-6)
    # an explicit dy is scaled too
    y = gc.Parameter([1.0, 2.0])
    gm = GradManager().attach([y])
    with gm:
        scaler.backward(gm, y * 3, dy=gc.tensor([1.0, -1.0]))
    np.testing.assert_array_equal(y.grad.numpy(), np.float32([3.0, -3.0]))


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_grad_scaler_skips_non_finite_steps_and_updates_its_factor():
    scaler = amp.GradScaler(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)
    x = gc.Parameter([1.0, 0.0])
    _scaled_step(scaler, x, lambda t: F.log(t).sum())          # 1 / 0 = inf
    assert x.grad is None and scaler.scale_factor == 2.0
    for expected in (2.0, 8.0, 8.0):                            # grows every 2nd finite step
        x.grad = None
        _scaled_step(scaler, x, lambda t: (t * 3).sum())
        np.testing.assert_array_equal(x.grad.numpy(), np.float32([3.0, 3.0]))
        assert scaler.scale_factor == expected
    scaler.update(new_scale=5.0)
    assert scaler.scale_factor == 5.0
    state = scaler.state_dict()
    other = amp.GradScaler()
    other.load_state_dict(state)
    assert other.state_dict() == state == {"scale_factor": 5.0, "growth_factor": 4.0, "backoff_factor": 0.25,
                                          "growth_interval": 2, "_growth_tracker": 1}


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_grad_scaler_with_fixed_factor_only_unscales():
    scaler = amp.GradScaler(init_scale=4.0, growth_interval=0)
    x = gc.Parameter([1.0, 0.0])
    _scaled_step(scaler, x, lambda t: F.log(t).sum())
    g = x.grad.numpy()
    assert g[0] == 1.0 and np.isinf(g[1]) and scaler.scale_factor == 4.0
    with pytest.raises(ValueError, match="init_scale"):
        amp.GradScaler(init_scale=0)
