"""Modules and optimizers: values and gradients against PyTorch (when
installed) and finite differences."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.testing import gradcheck, gradgradcheck


def test_module_parameters_in_attribute_order_and_state_dict():
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(1, 2, 3)
            self.bn = M.BatchNorm2d(2)
            self.fc = M.Linear(2, 3)

    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    state = net.state_dict()
    assert "bn.running_mean" in state and "bn.running_var" in state
    other = Net()
    other.load_state_dict(state)
    for (_, a), (_, b) in zip(net.named_parameters(), other.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(KeyError, match="missing"):
        other.load_state_dict({})
    assert net.train() is net and net.eval().bn.training is False


def test_batch_norm_matches_torch_in_training_and_eval():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(4, 3, 5, 5)).astype("float32")
    w_np, b_np = rng.normal(size=3).astype("float32"), rng.normal(size=3).astype("float32")
    bn = M.BatchNorm2d(3, momentum=0.9)
    bn.weight._reset(gc.tensor(w_np.reshape(1, 3, 1, 1)))
    bn.bias._reset(gc.tensor(b_np.reshape(1, 3, 1, 1)))
    x = gc.tensor(x_np)
    gm = GradManager().attach([x, bn.weight, bn.bias])
    with gm:
        y = bn(x)
        gm.backward((y * y).sum())
    tb = torch.nn.BatchNorm2d(3, momentum=0.1)
    with torch.no_grad():
        tb.weight.copy_(torch.tensor(w_np))
        tb.bias.copy_(torch.tensor(b_np))
    xt = torch.tensor(x_np, requires_grad=True)
    yt = tb(xt)
    (yt * yt).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(bn.weight.grad.numpy().ravel(), tb.weight.grad.numpy(), rtol=1e-4)
    np.testing.assert_allclose(bn.running_mean.numpy().ravel(), tb.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy().ravel(), tb.running_var.numpy(), rtol=1e-5)
    bn.eval()
    tb.eval()
    np.testing.assert_allclose(bn(x).numpy(), tb(xt).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_batch_norm_gradients_first_and_second_order():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 2, 2, 2))
    w = rng.normal(size=(1, 2, 1, 1))
    b = rng.normal(size=(1, 2, 1, 1))
    fn = lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)
    assert gradcheck(fn, [x, w, b], atol=1e-5)
    assert gradgradcheck(fn, [x, w, b], atol=1e-4)


def test_var_std_norm_match_numpy_and_differentiate():
    rng = np.random.default_rng(2)
    x_np = rng.normal(size=(3, 4))
    x = gc.tensor(x_np)
    np.testing.assert_allclose(F.var(x, 1).numpy(), x_np.var(1))
    np.testing.assert_allclose(F.std(x).numpy(), x_np.std())
    for ord_ in (1, 2, 3, float("inf")):
        np.testing.assert_allclose(F.norm(x, ord_, axis=1).numpy(), np.linalg.norm(x_np, ord_, axis=1), rtol=1e-12)
    assert gradcheck(lambda x: F.std(x, 0), [x_np])
    assert gradcheck(lambda x: F.norm(x, 3, axis=1), [x_np])


def test_dropout_scales_and_masks_and_is_repeatable():
    x = gc.tensor(np.ones((1000,), "float32"))
    gc.random.seed(3)
    y1 = F.dropout(x, 0.25).numpy()
    gc.random.seed(3)
    y2 = F.dropout(x, 0.25).numpy()
    np.testing.assert_array_equal(y1, y2)
    assert set(np.unique(y1)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.18 < (y1 == 0).mean() < 0.32
    gm = GradManager().attach(x)
    gc.random.seed(3)
    with gm:
        gm.backward(F.dropout(x, 0.25).sum())
    np.testing.assert_array_equal(x.grad.numpy(), y1)   # the gradient is the scaled mask
    d = M.Dropout(0.5).eval()
    np.testing.assert_array_equal(d(x).numpy(), x.numpy())


def _torch_step(torch, opt_cls, kwargs, p0, grads):
    p = torch.tensor(p0, requires_grad=True)
    opt = opt_cls([p], **kwargs)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach().numpy()


def _gc_step(opt_cls, kwargs, p0, grads):
    p = gc.Parameter(p0)
    opt = opt_cls([p], **kwargs)
    for g in grads:
        p.grad = gc.tensor(g)
        assert opt.step() is opt
    assert opt.clear_grad() is opt and p.grad is None
    return p.numpy()


@pytest.mark.parametrize("kind, kwargs", [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)),
])
def test_optimizers_match_torch(kind, kwargs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    p0 = rng.normal(size=(3, 2)).astype("float32")
    grads = [rng.normal(size=(3, 2)).astype("float32") for _ in range(4)]
    ours = _gc_step(getattr(optim, kind), kwargs, p0, grads)
    theirs = _torch_step(torch, getattr(torch.optim, kind), kwargs, p0, grads)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_optimizer_param_groups_and_skipping():
    a, b = gc.Parameter([1.0]), gc.Parameter([1.0])
    opt = optim.SGD([{"params": [a], "lr": 0.5}, {"params": [b]}], lr=0.1)
    a.grad = gc.tensor([1.0])
    opt.step()                      # b has no gradient: skipped
    np.testing.assert_allclose(a.numpy(), [0.5])
    np.testing.assert_allclose(b.numpy(), [1.0])
    with pytest.raises(ValueError):
        optim.SGD([], lr=0.1)
