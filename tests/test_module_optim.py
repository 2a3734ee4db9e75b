"""Modules and optimizers: values and gradients against PyTorch (when
installed) and finite differences."""
import pickle

import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager
from gradcore.testing import gradcheck, gradgradcheck
from oracle import optimizer_steps


def test_module_parameters_in_sorted_attribute_order_and_state_dict():
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(1, 2, 3)
            self.bn = M.BatchNorm2d(2)
            self.fc = M.Linear(2, 3)

    net = Net()
    names = [n for n, _ in net.named_parameters()]
    # MegEngine's order: attribute names sorted at each level, whatever order they were set in
    assert names == ["bn.bias", "bn.weight", "conv.bias", "conv.weight", "fc.bias", "fc.weight"]
    state = net.state_dict()
    assert list(state) == ["bn.bias", "bn.running_mean", "bn.running_var", "bn.weight",
                           "conv.bias", "conv.weight", "fc.bias", "fc.weight"]
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


# ---------------------------------------------------------------- MegEngine's Module API
def test_sequential_names_layers_like_megengine_and_torch():
    from collections import OrderedDict
    net = M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2))
    assert [n for n, _ in net.named_parameters()] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert [n for n, _ in net.named_modules()] == ["", "0", "1", "2"]
    assert [n for n, _ in net.named_children()] == ["0", "1", "2"]
    assert len(net) == 3 and isinstance(net[-1], M.Linear) and [type(m) for m in net][1] is M.ReLU
    tail = net[1:]
    assert isinstance(tail, M.Sequential) and [n for n, _ in tail.named_parameters()] == ["2.bias", "2.weight"]
    named = M.Sequential(OrderedDict(fc0=M.Linear(2, 3), act=M.ReLU(), fc1=M.Linear(3, 1)))
    assert list(named.state_dict()) == ["fc0.bias", "fc0.weight", "fc1.bias", "fc1.weight"]
    # traversal sorts the names, forward keeps the given order
    backwards = M.Sequential(OrderedDict(b=M.Linear(2, 3), a=M.Linear(3, 1)))
    assert [n for n, _ in backwards.named_children()] == ["a", "b"]
    assert backwards(gc.tensor(np.ones((1, 2), "float32"))).shape == (1, 1)
    net[2] = M.Linear(8, 5)
    assert net(gc.tensor(np.ones((1, 4), "float32"))).shape == (1, 5)
    del net[1]
    assert len(net) == 2 and [n for n, _ in net.named_children()] == ["0", "2"]
    big = M.Sequential(*[M.Linear(1, 1) for _ in range(12)])
    # names are sorted as strings, as in MegEngine: "10" and "11" come before "2"
    assert [n for n, _ in big.named_children()] == ["0", "1", "10", "11"] + [str(i) for i in range(2, 10)]
    assert [n for n, _ in big.named_parameters()][-2:] == ["9.bias", "9.weight"]


def test_module_traversal_containers_prefix_recursion_and_sharing():
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(2, 2)
            self.again = self.fc                    # the same module twice: listed once
            self.blocks = {"x": [M.Linear(2, 2), (M.ReLU(), M.Linear(2, 3))]}
            self.scale = gc.Parameter(np.ones(1, "float32"))
            self.count = gc.tensor(np.zeros(1, "float32"))     # a plain Tensor is a buffer

        def forward(self, x):
            return x

    net = Net()
    # sorted attribute names ("again" before "fc": the shared module is listed under "again")
    assert [n for n, _ in net.named_parameters()] == [
        "again.bias", "again.weight", "blocks.x.0.bias", "blocks.x.0.weight",
        "blocks.x.1.1.bias", "blocks.x.1.1.weight", "scale"]
    assert [n for n, _ in net.named_parameters(prefix="net")][0] == "net.again.bias"
    assert [n for n, _ in net.named_parameters(recursive=False)] == ["scale"]
    assert len(list(net.parameters(requires_grad=True))) == 7     # accepted and ignored, as MegEngine
    assert [n for n, _ in net.named_modules()] == ["", "again", "blocks.x.0", "blocks.x.1.0", "blocks.x.1.1"]
    assert len(list(net.children())) == 4
    assert [n for n, _ in net.named_buffers()] == ["count"] and len(list(net.buffers())) == 1
    net.train(False, recursive=False)
    assert net.training is False and net.fc.training is True
    net.eval()
    assert not any(m.training for m in net.modules())
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Net", "Linear", "Linear", "ReLU", "Linear"]


def test_forward_hooks_run_and_can_be_removed():
    lin = M.Linear(2, 2)
    calls = []
    pre = lin.register_forward_pre_hook(lambda m, inputs: calls.append(len(inputs)))
    post = lin.register_forward_hook(lambda m, inputs, out: out * 0)
    x = gc.tensor([[1.0, 2.0]])
    assert not lin(x).numpy().any() and calls == [1]
    pre.remove()
    post.remove()
    assert lin(x).numpy().any() and calls == [1]


def test_state_dict_flat_batch_norm_strict_loading_and_closures():
    net = M.Sequential(M.Conv2d(1, 2, 3), M.BatchNorm2d(2))
    state = net.state_dict()
    assert list(state) == ["0.bias", "0.weight", "1.bias", "1.running_mean", "1.running_var", "1.weight"]
    assert all(type(v) is np.ndarray for v in state.values())
    assert state["1.weight"].shape == (2,) and state["0.bias"].shape == (1, 2, 1, 1)   # MegEngine: XNorm flat
    state["0.weight"][:] = 5            # a copy: the module is untouched
    assert not (net[0].weight.numpy() == 5).any()
    other = M.Sequential(M.Conv2d(1, 2, 3), M.BatchNorm2d(2))
    other.load_state_dict(state)
    np.testing.assert_array_equal(other[0].weight.numpy(), 5)
    other.load_state_dict(dict(state, **{"1.running_mean": np.array([[[[1.0]], [[2.0]]]], "float32")}))
    np.testing.assert_array_equal(other[1].running_mean.numpy().ravel(), [1, 2])   # (1, C, 1, 1) loads too
    before = other[0].weight.numpy().copy()
    with pytest.raises(KeyError, match="unexpected"):
        other.load_state_dict(dict(state, extra=np.zeros(1)))
    with pytest.raises(ValueError, match="0.weight"):
        other.load_state_dict(dict(state, **{"0.weight": np.zeros((2, 1, 2, 2), "float32")}))
    with pytest.raises(KeyError, match="missing"):
        other.load_state_dict({"0.weight": np.zeros((2, 1, 3, 3), "float32")})
    np.testing.assert_array_equal(other[0].weight.numpy(), before)     # a failed load changes nothing
    other.load_state_dict({"0.weight": np.zeros((2, 1, 3, 3)), "0.bias": None}, strict=False)
    assert other[0].weight.dtype == np.float32 and not other[0].weight.numpy().any()
    other.load_state_dict(lambda key, t: np.full(t.shape, 3.0, "float32"))
    np.testing.assert_array_equal(other[1].running_var.numpy(), 3)


def test_conv2d_grouped_weight_is_megengine_5d_and_matches_torch(torch):
    conv = M.Conv2d(4, 6, 3, padding=1, groups=2)
    assert conv.weight.shape == (2, 3, 2, 3, 3) and conv.bias.shape == (1, 6, 1, 1)
    assert M.Conv2d(4, 6, 3).weight.shape == (6, 4, 3, 3)
    tconv = torch.nn.Conv2d(4, 6, 3, padding=1, groups=2)
    conv.weight._reset(gc.tensor(tconv.weight.detach().numpy().reshape(2, 3, 2, 3, 3)))
    conv.bias._reset(gc.tensor(tconv.bias.detach().numpy().reshape(1, 6, 1, 1)))
    x = np.random.default_rng(0).normal(size=(2, 4, 5, 5)).astype("float32")
    np.testing.assert_allclose(conv(gc.tensor(x)).numpy(), tconv(torch.tensor(x)).detach().numpy(),
                               rtol=1e-4, atol=1e-5)


def test_bad_layer_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"Linear.*last dimension is 3.*\(4, 5\)"):
        M.Linear(3, 2)(gc.tensor(np.ones((4, 5), "float32")))
    with pytest.raises(Exception, match="channel"):
        M.Conv2d(3, 2, 3)(gc.tensor(np.ones((1, 4, 5, 5), "float32")))
    with pytest.raises(ValueError, match="groups"):
        M.Conv2d(3, 6, 3, groups=2)
    with pytest.raises(ValueError, match="BatchNorm2d"):
        M.BatchNorm2d(3)(gc.tensor(np.ones((2, 4, 5, 5), "float32")))


def test_batch_norm_1d_and_freeze(torch):
    x = np.random.default_rng(1).normal(size=(4, 3, 5)).astype("float32")
    bn, tb = M.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    np.testing.assert_allclose(bn(gc.tensor(x)).numpy(), tb(torch.tensor(x)).detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy().ravel(), tb.running_var.numpy(), rtol=1e-5)
    frozen = M.BatchNorm2d(3, freeze=True)
    x4 = x.reshape(4, 3, 5, 1)
    np.testing.assert_allclose(frozen(gc.tensor(x4)).numpy(), x4 / np.sqrt(1 + 1e-5), rtol=1e-5)
    np.testing.assert_array_equal(frozen.running_mean.numpy(), 0)


# ---------------------------------------------------------------- optimizers
def test_optimizer_accepts_megengine_param_forms_and_rejects_bad_ones():
    p, q = gc.Parameter(np.ones((3, 2), "float32")), gc.Parameter(np.ones(2, "float32"))
    assert optim.SGD(p, lr=0.1).param_groups[0]["params"] == [p]          # one Parameter, not its rows
    assert optim.SGD({"params": p, "lr": 0.3}, lr=0.1).param_groups[0]["lr"] == 0.3
    opt = optim.Adam([p], lr=0.1)
    assert opt.add_param_group({"params": [q], "lr": 0.5}) is opt
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5] and opt.param_groups[1]["betas"] == (0.9, 0.999)
    with pytest.raises(TypeError, match="set"):
        optim.SGD({p, q}, lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        optim.SGD([{"params": [p]}, {"params": [p, q]}], lr=0.1)
    with pytest.raises(TypeError, match="SGD: can only optimize Parameters, got float"):
        optim.SGD([1.0], lr=0.1)
    # a plain Tensor (MegEngine's rule too): named, with its shape
    with pytest.raises(TypeError, match=r"Adam: can only optimize Parameters, got Tensor of shape \(2,\)"):
        optim.Adam([p, gc.tensor(np.ones(2, "float32"))], lr=0.1)
    p.grad = gc.tensor(np.ones(3, "float32"))
    with pytest.raises(ValueError, match=r"gradient of shape \(3,\).*\(3, 2\)"):
        optim.SGD([p], lr=0.1).step()
    p.grad = gc.tensor(np.ones((3, 2), "float32"))
    opt = optim.SGD([p], lr=0.1)
    assert opt.zero_grad() is opt and not p.grad.numpy().any()     # MegEngine's zero_grad: zeros
    assert opt.clear_grad() is opt and p.grad is None


def _mlp_pair(torch):
    t = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    g = M.Sequential(M.Linear(5, 7), M.ReLU(), M.Linear(7, 3))
    return t, g, (8, 5)


def _cnn_pair(torch):
    t = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4),
                            torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3, stride=2, groups=2),
                            torch.nn.Flatten(), torch.nn.Linear(16, 3))
    g = M.Sequential(M.Conv2d(2, 4, 3, padding=1, bias=False), M.BatchNorm2d(4), M.ReLU(),
                     M.Conv2d(4, 4, 3, stride=2, groups=2), M.Flatten(), M.Linear(16, 3))
    return t, g, (6, 2, 6, 6)


@pytest.mark.parametrize("make", [_mlp_pair, _cnn_pair])
@pytest.mark.parametrize("kind, kwargs", [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("Adam", dict(lr=1e-2, betas=(0.5, 0.9), weight_decay=0.05)),
])
def test_training_a_model_matches_torch_step_by_step(torch, make, kind, kwargs):
    tnet, net, xshape = make(torch)
    tparams = dict(tnet.named_parameters())
    names = [n for n, _ in net.named_parameters()]
    assert names == sorted(tparams)          # torch's names, in MegEngine's sorted order
    for name, p in net.named_parameters():
        p._reset(gc.tensor(tparams[name].detach().numpy().reshape(p.shape)))
    topt = getattr(torch.optim, kind)(tnet.parameters(), **kwargs)
    opt = getattr(optim, kind)(net.parameters(), **kwargs)
    gm = GradManager().attach(net.parameters())
    rng = np.random.default_rng(5)
    for step in range(4):
        x, y = rng.normal(size=xshape).astype("float32"), rng.normal(size=(xshape[0], 3)).astype("float32")
        if step == 2:                   # lr changed through param_groups takes effect
            for group in opt.param_groups + topt.param_groups:
                group["lr"] *= 0.5
        topt.zero_grad()
        ((tnet(torch.tensor(x)) - torch.tensor(y)) ** 2).mean().backward()
        topt.step()
        with gm:
            gm.backward(((net(gc.tensor(x)) - gc.tensor(y)) ** 2).mean())
        opt.step().clear_grad()
        for name, p in net.named_parameters():
            tp = tparams[name]
            np.testing.assert_allclose(p.numpy().reshape(tp.shape), tp.detach().numpy(), rtol=2e-4, atol=2e-5,
                                       err_msg=f"{name} after step {step}")


@pytest.mark.parametrize("kind, kwargs", [
    ("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=0.05)), ("AdamW", dict(lr=0.05)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.1)), ("Adadelta", dict(lr=1.0)),
])
def test_optimizer_state_dict_resumes_training_exactly(kind, kwargs):
    def make():
        gc.random.seed(0)
        return M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 1))

    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(5, 3)).astype("float32") for _ in range(4)]

    def train(net, opt, xs):
        gm = GradManager().attach(net.parameters())
        for x in xs:
            with gm:
                gm.backward((net(gc.tensor(x)) ** 2).mean())
            opt.step().clear_grad()

    whole = make()
    train(whole, getattr(optim, kind)(whole.parameters(), **kwargs), batches)
    first = make()
    opt = getattr(optim, kind)(first.parameters(), **kwargs)
    train(first, opt, batches[:2])
    saved_net, saved_opt = first.state_dict(), opt.state_dict()
    assert saved_opt["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert saved_opt["state"][0].get("step", 2) == 2       # optimizers that count steps
    assert all(type(v) is np.ndarray for st in saved_opt["state"].values() for v in st.values()
               if not np.isscalar(v))
    resumed = make()
    opt2 = getattr(optim, kind)(resumed.parameters(), **dict(kwargs, lr=99.0))
    resumed.load_state_dict(saved_net)
    opt2.load_state_dict(saved_opt)
    assert opt2.param_groups[0]["lr"] == kwargs["lr"]
    train(resumed, opt2, batches[2:])
    for a, b in zip(whole.parameters(), resumed.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="parameters"):
        getattr(optim, kind)(M.Linear(2, 2).parameters(), **kwargs).load_state_dict(saved_opt)


def _lamb_reference(p, grads, lr, betas, eps, wd, bias_correction=True, always_adapt=False):
    """MegEngine's LAMBUpdate kernel, in float64."""
    (b1, b2), m, v, p = betas, np.zeros_like(p), np.zeros_like(p), p.copy()
    for step, g in enumerate(grads, 1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        bc1, bc2 = (1 - b1 ** step, 1 - b2 ** step) if bias_correction else (1.0, 1.0)
        r = (m / bc1) / (np.sqrt(v / bc2) + eps) + wd * p
        pn, rn = np.linalg.norm(p), np.linalg.norm(r)
        trust = pn / rn if (always_adapt or wd > 0) and pn > 0 and rn > 0 else 1.0
        p = p - lr * trust * r
    return p


@pytest.mark.parametrize("wd, always_adapt, bias_correction", [(0.0, False, True), (0.01, False, True),
                                                               (0.0, True, False), (0.1, True, True)])
def test_lamb_matches_megengines_update(wd, always_adapt, bias_correction):
    rng = np.random.default_rng(0)
    p0, grads = rng.standard_normal((3, 4)), [rng.standard_normal((3, 4)) for _ in range(5)]
    w = gc.Parameter(p0.copy())
    opt = optim.LAMB([w], lr=0.1, betas=(0.8, 0.99), weight_decay=wd, always_adapt=always_adapt,
                     bias_correction=bias_correction)
    for g in grads[:3]:
        w.grad = gc.tensor(g)
        opt.step()
    state = opt.state_dict()
    resumed = optim.LAMB([w], lr=0.1, betas=(0.8, 0.99), weight_decay=wd, always_adapt=always_adapt,
                         bias_correction=bias_correction)
    resumed.load_state_dict(state)
    for g in grads[3:]:
        w.grad = gc.tensor(g)
        resumed.step()
    np.testing.assert_allclose(w.numpy(), _lamb_reference(p0, grads, 0.1, (0.8, 0.99), 1e-8, wd, bias_correction,
                                                           always_adapt), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="LAMB"):
        optim.LAMB([w], lr=-1.0)


def test_lamb_fp16_keeps_a_float32_master_copy():
    rng = np.random.default_rng(1)
    p0, grads = rng.standard_normal((4,)).astype(np.float16), [rng.standard_normal(4).astype(np.float16)
                                                             for _ in range(3)]
    w = gc.Parameter(p0.copy())
    opt = optim.LAMBFp16([w], lr=0.05, weight_decay=0.01)
    for g in grads:
        w.grad = gc.tensor(g)
        opt.step()
    master = opt._state[w]["param_fp32"]
    assert w.dtype == np.float16 and master.dtype == np.float32
    want = _lamb_reference(p0.astype(np.float64), [g.astype(np.float64) for g in grads], 0.05, (0.9, 0.999), 1e-8,
                           0.01)
    np.testing.assert_allclose(master, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w.numpy(), master.astype(np.float16))



def test_lamb_fp16_resumes_bit_identical_with_float32_state():
    # load_state_dict cast every state array to the parameter's dtype: the
    # float32 master copy and moments of a float16 parameter came back float16
    rng = np.random.default_rng(2)
    p0 = rng.standard_normal((3, 4)).astype(np.float16)
    grads = [rng.standard_normal((3, 4)).astype(np.float16) for _ in range(6)]

    whole = gc.Parameter(p0.copy())
    whole_opt = optim.LAMBFp16([whole], lr=0.05, weight_decay=0.01)
    optimizer_steps(whole_opt, whole, grads)
    w = gc.Parameter(p0.copy())
    opt = optim.LAMBFp16([w], lr=0.05, weight_decay=0.01)
    optimizer_steps(opt, w, grads[:3])
    saved = pickle.loads(pickle.dumps(opt.state_dict()))
    resumed = optim.LAMBFp16([w], lr=0.05, weight_decay=0.01)
    resumed.load_state_dict(saved)
    assert {k: v.dtype for k, v in resumed._state[w].items() if k != "step"} == \
        {"param_fp32": np.float32, "exp_avg": np.float32, "exp_avg_sq": np.float32}
    optimizer_steps(resumed, w, grads[3:])
    assert w.dtype == np.float16
    np.testing.assert_array_equal(resumed._state[w]["param_fp32"].numpy(), whole_opt._state[whole]["param_fp32"].numpy())
    np.testing.assert_array_equal(w.numpy(), whole.numpy())
