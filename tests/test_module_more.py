"""MegEngine's other layers, optimizers and LR schedulers, checked against
PyTorch: forward values, input and parameter gradients, optimizer steps and
schedules, state_dict round trips, train/eval behaviour."""
import numpy as np
import pytest

import gradcore as gc
import gradcore.functional as F
import gradcore.module as M
import gradcore.optimizer as optim
from gradcore.autodiff import GradManager


def _run(module, x_np, dy_np=None):
    """``module(x)`` and the gradients of ``sum(y * dy)`` for x and each
    parameter, the latter by parameter name."""
    x = gc.tensor(x_np)
    params = dict(module.named_parameters())
    gm = GradManager().attach([x] + list(params.values()))
    with gm:
        y = module(x)
        dy = np.ones(y.shape, "float32") if dy_np is None else dy_np
        gm.backward((y * gc.tensor(dy)).sum())
    return y.numpy(), x.grad.numpy(), {n: p.grad.numpy() for n, p in params.items()}


def _run_torch(torch, module, x_np, dy_np=None):
    x = torch.tensor(x_np, requires_grad=True)
    y = module(x)
    dy = torch.ones_like(y) if dy_np is None else torch.tensor(dy_np)
    (y * dy).sum().backward()
    return y.detach().numpy(), x.grad.numpy(), {n: p.grad.numpy() for n, p in module.named_parameters()}


def _copy_params(ours, theirs):
    """Torch's parameter values into ours, by name (gradcore lists them in
    MegEngine's sorted order, torch in definition order), reshaped to our shapes."""
    ps, tps = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert sorted(ps) == sorted(tps)
    for name, p in ps.items():
        p._reset(gc.tensor(tps[name].detach().numpy().reshape(p.shape)))


def _assert_same(ours, theirs, rtol=1e-4, atol=1e-5):
    (y, dx, dps), (ty, tdx, tdps) = ours, theirs
    np.testing.assert_allclose(y, ty, rtol=rtol, atol=atol)
    np.testing.assert_allclose(dx, tdx, rtol=rtol, atol=atol)
    assert sorted(dps) == sorted(tdps)
    for name, g in dps.items():
        np.testing.assert_allclose(g.reshape(tdps[name].shape), tdps[name], rtol=rtol, atol=atol, err_msg=name)


# ---------------------------------------------------------------- activations
@pytest.mark.parametrize("make", [
    lambda torch: (M.ReLU(), torch.nn.ReLU()),
    lambda torch: (M.Sigmoid(), torch.nn.Sigmoid()),
    lambda torch: (M.SiLU(), torch.nn.SiLU()),
    lambda torch: (M.GELU(), torch.nn.GELU()),
    lambda torch: (M.LeakyReLU(), torch.nn.LeakyReLU()),
    lambda torch: (M.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)),
    lambda torch: (M.Softmax(), torch.nn.Softmax(dim=1)),        # MegEngine's default axis: 1 for 4-d
    lambda torch: (M.Softmax(axis=-1), torch.nn.Softmax(dim=-1)),
    lambda torch: (M.PReLU(), torch.nn.PReLU()),
    lambda torch: (M.PReLU(3, init=0.1), torch.nn.PReLU(3, init=0.1)),
], ids=["relu", "sigmoid", "silu", "gelu", "leaky_relu", "leaky_relu_0.2", "softmax", "softmax_-1",
        "prelu", "prelu_per_channel"])
def test_activations_match_torch(torch, rng, make):
    ours, theirs = make(torch)
    x = rng.normal(size=(2, 3, 4, 5)).astype("float32") * 3
    dy = rng.normal(size=x.shape).astype("float32")
    _copy_params(ours, theirs)
    _assert_same(_run(ours, x, dy), _run_torch(torch, theirs, x, dy))


def test_activation_defaults_and_prelu_weight_shapes_follow_megengine():
    assert M.LeakyReLU().negative_slope == 0.01 and M.Softmax().axis is None
    assert M.PReLU().weight.shape == (1,) and M.PReLU().weight.numpy()[0] == np.float32(0.25)
    prelu = M.PReLU(num_parameters=4, init=0.5)
    assert prelu.weight.shape == (1, 4, 1, 1) and (prelu.weight.numpy() == 0.5).all()
    assert list(prelu.state_dict()) == ["weight"] and prelu.state_dict()["weight"].shape == (1, 4, 1, 1)
    np.testing.assert_allclose(M.PReLU()(gc.tensor([-1.2, -3.7, 2.7])).numpy(), [-0.3, -0.925, 2.7], rtol=1e-6)
    with pytest.raises(ValueError, match=r"PReLU\(4\).*\(2, 3, 5, 5\)"):
        prelu(gc.tensor(np.ones((2, 3, 5, 5), "float32")))
    for m in (M.ReLU(), M.Sigmoid(), M.SiLU(), M.GELU(), M.LeakyReLU(), M.Softmax(), M.Identity()):
        assert list(m.parameters()) == [] and m.state_dict() == {}
    x = gc.tensor([1.0, 2.0])
    assert M.Identity()(x) is x


# ---------------------------------------------------------------- embedding
def test_embedding_matches_torch_and_accumulates_repeated_rows(torch, rng):
    emb, temb = M.Embedding(7, 4), torch.nn.Embedding(7, 4)
    assert emb.weight.shape == (7, 4)
    _copy_params(emb, temb)
    idx = np.array([[0, 3, 3], [6, 0, 3]], "int32")
    dy = rng.normal(size=(2, 3, 4)).astype("float32")
    w = emb.weight
    gm = GradManager().attach([w])
    with gm:
        y = emb(gc.tensor(idx))
        gm.backward((y * gc.tensor(dy)).sum())
    ty = temb(torch.tensor(idx, dtype=torch.long))
    (ty * torch.tensor(dy)).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy())
    np.testing.assert_allclose(w.grad.numpy(), temb.weight.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_embedding_initial_weight_freeze_from_pretrained_and_errors():
    table = np.arange(10, dtype="float32").reshape(5, 2)
    emb = M.Embedding(5, 2, initial_weight=gc.tensor(table))
    table[0, 0] = 99                           # a copy: the module keeps its own weight
    np.testing.assert_array_equal(emb(gc.tensor([[1, 0]], dtype="int32")).numpy(), [[[2, 3], [0, 1]]])
    np.testing.assert_array_equal(M.Embedding(5, 2, initial_weight=table).weight.numpy()[0], [99, 1])
    with pytest.raises(ValueError, match=r"\(5, 2\)"):
        M.Embedding(4, 2, initial_weight=table)
    with pytest.raises(ValueError, match="padding_idx"):
        M.Embedding(5, 2, padding_idx=0)
    with pytest.raises(ValueError, match="max_norm"):
        M.Embedding(5, 2, max_norm=1.0)

    frozen = M.Embedding.from_pretrained(gc.tensor(table))
    assert frozen.freeze and frozen.num_embeddings == 5 and frozen.embedding_dim == 2
    assert not M.Embedding.from_pretrained(table, freeze=False).freeze
    with pytest.raises(ValueError, match="2-d"):
        M.Embedding.from_pretrained(np.zeros(3, "float32"))
    x = gc.tensor(np.ones((1, 2), "float32"))
    gm = GradManager().attach([frozen.weight, x])
    with gm:                                   # no gradient reaches a frozen weight
        gm.backward((frozen(gc.tensor([0, 4], dtype="int32")) * x).sum())
    assert frozen.weight.grad is None or not frozen.weight.grad.numpy().any()

    gc.random.seed(0)
    a = M.Embedding(50, 40).weight.numpy()
    gc.random.seed(0)
    np.testing.assert_array_equal(M.Embedding(50, 40).weight.numpy(), a)     # seeded, N(0, 1)
    assert abs(a.mean()) < 0.1 and 0.9 < a.std() < 1.1 and a.dtype == np.float32
    state = emb.state_dict()
    other = M.Embedding(5, 2)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.weight.numpy(), emb.weight.numpy())


# ---------------------------------------------------------------- normalisation
@pytest.mark.parametrize("shape, normalized_shape", [((4, 6), 6), ((2, 3, 4, 5), (4, 5))])
def test_layer_norm_matches_torch(torch, rng, shape, normalized_shape):
    ln = M.LayerNorm(normalized_shape)
    tln = torch.nn.LayerNorm(normalized_shape)
    with torch.no_grad():
        for tp in tln.parameters():
            tp.copy_(torch.tensor(rng.normal(size=tuple(tp.shape)).astype("float32")))
    _copy_params(ln, tln)
    x = (rng.normal(size=shape) * 2 + 1).astype("float32")
    dy = rng.normal(size=shape).astype("float32")
    _assert_same(_run(ln, x, dy), _run_torch(torch, tln, x, dy), rtol=2e-4, atol=2e-5)
    plain, tplain = M.LayerNorm(normalized_shape, eps=1e-3, affine=False), \
        torch.nn.LayerNorm(normalized_shape, eps=1e-3, elementwise_affine=False)
    assert list(plain.parameters()) == [] and plain.weight is None
    _assert_same(_run(plain, x, dy), _run_torch(torch, tplain, x, dy), rtol=2e-4, atol=2e-5)


def test_layer_norm_parameters_and_state():
    ln = M.LayerNorm((3, 4))
    assert ln.normalized_shape == (3, 4) and ln.eps == 1e-5 and ln.affine
    assert ln.weight.shape == (3, 4) and (ln.weight.numpy() == 1).all() and not ln.bias.numpy().any()
    assert M.LayerNorm(5).normalized_shape == (5,)
    assert list(ln.state_dict()) == ["bias", "weight"] and ln.state_dict()["weight"].shape == (3, 4)
    with pytest.raises(ValueError):
        ln(gc.tensor(np.ones((2, 4, 3), "float32")))


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm_matches_torch(torch, rng, groups):
    gn, tgn = M.GroupNorm(groups, 6), torch.nn.GroupNorm(groups, 6)
    with torch.no_grad():
        for tp in tgn.parameters():
            tp.copy_(torch.tensor(rng.normal(size=tuple(tp.shape)).astype("float32")))
    _copy_params(gn, tgn)
    x = (rng.normal(size=(3, 6, 4, 5)) * 3 - 1).astype("float32")
    dy = rng.normal(size=x.shape).astype("float32")
    _assert_same(_run(gn, x, dy), _run_torch(torch, tgn, x, dy), rtol=2e-4, atol=2e-5)


def test_instance_norm_matches_torch_and_is_the_same_in_train_and_eval(torch, rng):
    norm, tnorm = M.InstanceNorm(4), torch.nn.InstanceNorm2d(4, affine=True)
    with torch.no_grad():
        for tp in tnorm.parameters():
            tp.copy_(torch.tensor(rng.normal(size=tuple(tp.shape)).astype("float32")))
    _copy_params(norm, tnorm)
    x = (rng.normal(size=(2, 4, 5, 3)) * 2 + 3).astype("float32")
    dy = rng.normal(size=x.shape).astype("float32")
    ours = _run(norm, x, dy)
    _assert_same(ours, _run_torch(torch, tnorm, x, dy), rtol=2e-4, atol=2e-5)
    norm.eval()
    np.testing.assert_array_equal(norm(gc.tensor(x)).numpy(), ours[0])        # no running statistics
    plain = M.InstanceNorm(4, affine=False)
    tplain = torch.nn.InstanceNorm2d(4)
    np.testing.assert_allclose(plain(gc.tensor(x)).numpy(), tplain(torch.tensor(x)).numpy(), rtol=1e-4, atol=1e-5)


def test_group_and_instance_norm_parameters_state_and_errors():
    gn = M.GroupNorm(2, 4)
    assert (gn.num_groups, gn.num_channels, gn.eps, gn.affine) == (2, 4, 1e-5, True)
    assert gn.weight.shape == (4,) and gn.bias.shape == (4,)
    assert list(gn.state_dict()) == ["bias", "weight"]
    assert list(M.GroupNorm(2, 4, affine=False).parameters()) == []
    inst = M.InstanceNorm(3)
    assert inst.weight.shape == (3,) and (inst.num_channels, inst.eps, inst.affine) == (3, 1e-5, True)
    with pytest.raises(ValueError, match="divisible"):
        M.GroupNorm(3, 4)
    with pytest.raises(ValueError, match=r"GroupNorm.*\(N, 4, \.\.\.\).*\(2, 3, 5, 5\)"):
        gn(gc.tensor(np.ones((2, 3, 5, 5), "float32")))
    with pytest.raises(ValueError, match="InstanceNorm"):
        inst(gc.tensor(np.ones((2, 4, 5, 5), "float32")))
    net = M.Sequential(M.Conv2d(1, 4, 3), M.GroupNorm(2, 4), M.InstanceNorm(4))
    other = M.Sequential(M.Conv2d(1, 4, 3), M.GroupNorm(2, 4), M.InstanceNorm(4))
    net[1].weight._reset(gc.tensor(np.arange(4, dtype="float32")))
    other.load_state_dict(net.state_dict())
    np.testing.assert_array_equal(other[1].weight.numpy(), [0, 1, 2, 3])


# ---------------------------------------------------------------- adaptive pooling
needs_adaptive = pytest.mark.skipif(not hasattr(F.nn, "adaptive_avg_pool2d"),
                                    reason="F.nn.adaptive_*_pool2d not available")


@needs_adaptive
@pytest.mark.parametrize("oshp", [(2, 2), 1, (3, 2)])
def test_adaptive_pools_match_torch(torch, rng, oshp):
    x = rng.normal(size=(2, 3, 6, 4)).astype("float32")
    for ours, theirs in ((M.AdaptiveAvgPool2d(oshp), torch.nn.AdaptiveAvgPool2d(oshp)),
                         (M.AdaptiveMaxPool2d(oshp), torch.nn.AdaptiveMaxPool2d(oshp))):
        assert ours.oshp == oshp and list(ours.parameters()) == []
        dy = rng.normal(size=theirs(torch.tensor(x)).shape).astype("float32")
        _assert_same(_run(ours, x, dy), _run_torch(torch, theirs, x, dy))


@needs_adaptive
def test_adaptive_pools_megengine_examples():
    x = gc.tensor(np.arange(16, dtype="float32").reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(M.AdaptiveMaxPool2d((2, 2))(x).numpy(), [[[[5, 7], [13, 15]]]])
    np.testing.assert_array_equal(M.AdaptiveAvgPool2d((2, 2))(x).numpy(), [[[[2.5, 4.5], [10.5, 12.5]]]])
    # sizes that do not divide: MegEngine's windows, stride in // out and kernel in - (out - 1) * stride
    x_np = np.random.default_rng(3).normal(size=(2, 3, 5, 7)).astype("float32")
    (sh, sw), (kh, kw) = (1, 3), (3, 4)
    windows = np.stack([np.stack([x_np[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw] for j in range(2)], -1)
                        for i in range(3)], -2)                  # (N, C, kh, kw, 3, 2)
    np.testing.assert_allclose(M.AdaptiveMaxPool2d((3, 2))(gc.tensor(x_np)).numpy(), windows.max((2, 3)))
    np.testing.assert_allclose(M.AdaptiveAvgPool2d((3, 2))(gc.tensor(x_np)).numpy(), windows.mean((2, 3)),
                               rtol=1e-5, atol=1e-6)
    assert "oshp=(3, 2)" in repr(M.AdaptiveAvgPool2d((3, 2)))


# ---------------------------------------------------------------- Conv1d
needs_conv1d = pytest.mark.skipif(not hasattr(F.nn, "conv1d"), reason="F.nn.conv1d not available")


@needs_conv1d
@pytest.mark.parametrize("kwargs", [
    dict(), dict(stride=2, padding=1), dict(padding=2, dilation=2, bias=False), dict(groups=2, padding=1),
    dict(padding=2, padding_mode="reflect"), dict(padding=1, padding_mode="replicate", stride=2),
], ids=["plain", "stride-pad", "dilation-nobias", "groups", "reflect", "replicate"])
def test_conv1d_matches_torch(torch, rng, kwargs):
    conv = M.Conv1d(4, 6, 3, **kwargs)
    tconv = torch.nn.Conv1d(4, 6, 3, **kwargs)          # same names, same padding modes
    groups = kwargs.get("groups", 1)
    assert conv.weight.shape == ((6, 4, 3) if groups == 1 else (2, 3, 2, 3))
    assert conv.bias is None if kwargs.get("bias") is False else conv.bias.shape == (1, 6, 1)
    _copy_params(conv, tconv)
    x = rng.normal(size=(2, 4, 9)).astype("float32")
    dy = rng.normal(size=tuple(tconv(torch.tensor(x)).shape)).astype("float32")
    _assert_same(_run(conv, x, dy), _run_torch(torch, tconv, x, dy))


@needs_conv1d
def test_conv1d_defaults_init_and_errors():
    gc.random.seed(1)
    conv = M.Conv1d(3, 1, 3)
    assert conv(gc.tensor(np.arange(24, dtype="float32").reshape(2, 3, 4))).shape == (2, 1, 2)
    assert (conv.stride, conv.padding, conv.dilation, conv.groups, conv.padding_mode) == (1, 0, 1, 1, "zeros")
    assert not conv.bias.numpy().any() and list(conv.state_dict()) == ["bias", "weight"]
    w = M.Conv1d(50, 40, 5).weight.numpy()
    assert abs(w.std() - np.sqrt(1 / 250)) < 0.005          # N(0, 1 / (kernel_size * in_channels))
    with pytest.raises(ValueError, match="groups"):
        M.Conv1d(3, 6, 3, groups=2)
    with pytest.raises(ValueError, match="padding_mode"):
        M.Conv1d(3, 6, 3, padding_mode="circular")
    with pytest.raises(ValueError, match="stride"):
        M.Conv1d(3, 6, 3, stride=0)
    assert "padding_mode='reflect'" in repr(M.Conv1d(3, 6, 3, padding=1, padding_mode="reflect"))


# ---------------------------------------------------------------- optimizers
def _steps(opt_cls, kwargs, p0, grads):
    p = gc.Parameter(p0)
    opt = opt_cls([p], **kwargs)
    out = []
    for g in grads:
        p.grad = gc.tensor(g)
        assert opt.step() is opt
        out.append(p.numpy().copy())
    return out


def _torch_steps(torch, opt_cls, kwargs, p0, grads):
    p = torch.tensor(p0, requires_grad=True)
    opt = opt_cls([p], **kwargs)
    out = []
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


@pytest.mark.parametrize("kind, kwargs", [
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.3)),
    ("AdamW", dict(lr=0.01, weight_decay=0.0)),
    ("Adagrad", dict()),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.05)),
])
def test_new_optimizers_match_torch_every_step(torch, kind, kwargs):
    rng = np.random.default_rng(4)
    p0 = rng.normal(size=(3, 2)).astype("float32")
    grads = [rng.normal(size=(3, 2)).astype("float32") for _ in range(6)]
    ours = _steps(getattr(optim, kind), kwargs, p0, grads)
    theirs = _torch_steps(torch, getattr(torch.optim, kind), kwargs, p0, grads)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{kind} after step {step}")


def test_optimizer_defaults_follow_megengine():
    p = gc.Parameter(np.ones(2, "float32"))
    g = optim.AdamW([p], lr=0.1).param_groups[0]
    assert (g["betas"], g["eps"], g["weight_decay"]) == ((0.9, 0.999), 1e-8, 1e-2)
    g = optim.Adagrad([p]).param_groups[0]
    assert (g["lr"], g["lr_decay"], g["eps"], g["weight_decay"]) == (1e-2, 0.0, 1e-10, 0.0)
    g = optim.Adadelta([p]).param_groups[0]
    assert (g["lr"], g["rho"], g["eps"], g["weight_decay"]) == (1.0, 0.9, 1e-6, 0.0)
    for bad in (lambda: optim.AdamW([p], lr=-1), lambda: optim.AdamW([p], lr=0.1, betas=(1.0, 0.9)),
                lambda: optim.Adagrad([p], lr_decay=-1), lambda: optim.Adadelta([p], rho=1.5),
                lambda: optim.Adadelta([p], weight_decay=-0.1)):
        with pytest.raises(ValueError):
            bad()


def test_adagrad_and_adamw_follow_megengine_formulas():
    """MegEngine's Adagrad puts eps inside the square root, which shows with a
    large eps; AdamW's decay uses the parameter from before the step."""
    rng = np.random.default_rng(7)
    p0 = rng.normal(size=5).astype("float32")
    grads = [rng.normal(size=5).astype("float32") for _ in range(5)]
    lr, lr_decay, eps, wd = 0.1, 0.1, 0.5, 0.2
    p, acc = p0.astype("float64"), np.zeros(5)
    for step, (ours, g) in enumerate(zip(_steps(optim.Adagrad, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                                                     weight_decay=wd), p0, grads), grads), 1):
        g = g + wd * p
        acc += g * g
        p = p - lr / (1 + (step - 1) * lr_decay) * g / np.sqrt(acc + eps)
        np.testing.assert_allclose(ours, p, rtol=1e-5)
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.1
    p, m, v = p0.astype("float64"), np.zeros(5), np.zeros(5)
    for t, (ours, g) in enumerate(zip(_steps(optim.AdamW, dict(lr=lr, weight_decay=wd), p0, grads), grads), 1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr * ((m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * p)
        np.testing.assert_allclose(ours, p, rtol=1e-5)


def test_new_optimizers_skip_parameters_without_gradients_and_use_groups():
    a, b = gc.Parameter([1.0, 2.0]), gc.Parameter([1.0, 2.0])
    for cls in (optim.AdamW, optim.Adagrad, optim.Adadelta):
        opt = cls([{"params": [a], "lr": 0.5}, {"params": [b]}], lr=0.1)
        a.grad, b.grad = gc.tensor([1.0, -1.0]), None
        before = b.numpy().copy()
        opt.step()
        np.testing.assert_array_equal(b.numpy(), before)
        assert opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[1]["lr"] == 0.1


def _mlp_pair(torch):
    t = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.LayerNorm(8), torch.nn.GELU(),
                            torch.nn.Linear(8, 8), torch.nn.PReLU(), torch.nn.Linear(8, 3))
    g = M.Sequential(M.Linear(5, 8), M.LayerNorm(8), M.GELU(), M.Linear(8, 8), M.PReLU(), M.Linear(8, 3))
    return t, g, (6, 5)


def _cnn_pair(torch):
    t = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.GroupNorm(2, 4), torch.nn.SiLU(),
                            torch.nn.Conv2d(4, 4, 3, padding=1, bias=False), torch.nn.GroupNorm(4, 4),
                            torch.nn.LeakyReLU(0.1), torch.nn.Flatten(), torch.nn.Linear(64, 3))
    g = M.Sequential(M.Conv2d(2, 4, 3, padding=1), M.GroupNorm(2, 4), M.SiLU(),
                     M.Conv2d(4, 4, 3, padding=1, bias=False), M.InstanceNorm(4),
                     M.LeakyReLU(0.1), M.Flatten(), M.Linear(64, 3))
    return t, g, (4, 2, 4, 4)


@pytest.mark.parametrize("make", [_mlp_pair, _cnn_pair])
@pytest.mark.parametrize("kind, kwargs", [
    ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    # eps=0: MegEngine adds Adagrad's eps inside the square root, PyTorch after it, and the
    # first step is lr * g / sqrt(g * g + eps), so a gradient near sqrt(eps) would show it
    ("Adagrad", dict(lr=5e-2, lr_decay=0.01, eps=0.0, weight_decay=1e-3)),
    ("Adadelta", dict(lr=1.0, rho=0.9, weight_decay=1e-3)),
])
def test_training_with_new_layers_and_optimizers_matches_torch(torch, make, kind, kwargs):
    tnet, net, xshape = make(torch)
    _copy_params(net, tnet)                  # same names as torch, in sorted order
    assert [n for n, _ in net.named_parameters()] == sorted(n for n, _ in tnet.named_parameters())
    topt = getattr(torch.optim, kind)(tnet.parameters(), **kwargs)
    opt = getattr(optim, kind)(net.parameters(), **kwargs)
    tsched = torch.optim.lr_scheduler.MultiStepLR(topt, milestones=[2, 4], gamma=0.5)
    sched = optim.MultiStepLR(opt, milestones=[2, 4], gamma=0.5)
    gm = GradManager().attach(net.parameters())
    rng = np.random.default_rng(5)
    for step in range(6):
        x, y = rng.normal(size=xshape).astype("float32"), rng.normal(size=(xshape[0], 3)).astype("float32")
        topt.zero_grad()
        ((tnet(torch.tensor(x)) - torch.tensor(y)) ** 2).mean().backward()
        topt.step()
        tsched.step()
        with gm:
            gm.backward(((net(gc.tensor(x)) - gc.tensor(y)) ** 2).mean())
        opt.step().clear_grad()
        sched.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(topt.param_groups[0]["lr"])
        tparams = dict(tnet.named_parameters())
        for name, p in net.named_parameters():
            tp = tparams[name]
            np.testing.assert_allclose(p.numpy().reshape(tp.shape), tp.detach().numpy(), rtol=5e-4, atol=5e-5,
                                       err_msg=f"{name} after step {step}")


# ---------------------------------------------------------------- LR schedulers
def test_multi_step_lr_matches_torch_over_epochs(torch):
    a, b = gc.Parameter([1.0]), gc.Parameter([2.0])
    opt = optim.SGD([{"params": [a], "lr": 0.3}, {"params": [b]}], lr=0.1, momentum=0.9)
    ta, tb = torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)
    topt = torch.optim.SGD([{"params": [ta], "lr": 0.3}, {"params": [tb]}], lr=0.1, momentum=0.9)
    sched = optim.MultiStepLR(opt, milestones=[2, 5, 5, 7], gamma=0.5)
    tsched = torch.optim.lr_scheduler.MultiStepLR(topt, milestones=[2, 5, 5, 7], gamma=0.5)
    assert sched.base_lrs == [0.3, 0.1] and sched.current_epoch == 0
    for epoch in range(10):
        ours = [g["lr"] for g in opt.param_groups]
        np.testing.assert_allclose(ours, [g["lr"] for g in topt.param_groups], rtol=1e-12,
                                   err_msg=f"epoch {epoch}")
        assert ours == pytest.approx(sched.get_lr())
        opt.step()                      # no gradients: nothing moves, but torch wants this order
        topt.step()
        sched.step()
        tsched.step()
    assert opt.param_groups[1]["lr"] == pytest.approx(0.1 * 0.5 ** 4)


def test_multi_step_lr_state_dict_resume_and_errors():
    p = gc.Parameter([1.0])
    opt = optim.SGD([p], lr=1.0)
    sched = optim.MultiStepLR(opt, [1, 3])
    assert opt.param_groups[0]["initial_lr"] == 1.0 and sched.gamma == 0.1
    for _ in range(3):
        sched.step()
    assert sched.current_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.01)
    state = sched.state_dict()
    assert state == {"milestones": [1, 3], "gamma": 0.1, "current_epoch": 3}
    saved_opt = opt.state_dict()

    # resume: a fresh optimizer loads its groups (initial_lr included), then the scheduler resumes
    opt2 = optim.SGD([gc.Parameter([1.0])], lr=1.0)
    sched2 = optim.MultiStepLR(opt2, [1, 3])
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.01)
    sched2.step()
    sched.step()
    assert sched2.current_epoch == sched.current_epoch == 4
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])

    # current_epoch != -1 needs initial_lr in every group
    with pytest.raises(KeyError, match="initial_lr"):
        optim.MultiStepLR(optim.SGD([gc.Parameter([1.0])], lr=1.0), [1], current_epoch=2)
    resumed = optim.MultiStepLR(opt, [1, 3], current_epoch=1)     # opt has initial_lr = 1.0
    assert resumed.current_epoch == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.1)
    sched.step(epoch=0)                                            # an explicit epoch
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="increasing"):
        optim.MultiStepLR(opt, [3, 1])
    with pytest.raises(TypeError, match="Optimizer"):
        optim.MultiStepLR([p], [1])
    with pytest.raises(KeyError, match="gamma"):
        sched.load_state_dict({"milestones": [1], "current_epoch": 0})
    assert sched.gamma == 0.1                                      # a failed load changes nothing
    with pytest.raises(NotImplementedError):
        optim.LRScheduler(optim.SGD([gc.Parameter([1.0])], lr=1.0))


# ---------------------------------------------------------------- MegEngine's fused and shape layers
class _TorchConvBn(object):
    """torch's Conv2d, BatchNorm2d (and ReLU) under MegEngine's fused
    module's parameter names (conv.*, bn.*)."""

    def __init__(self, torch, relu, **kw):
        self.torch = torch
        self.m = torch.nn.ModuleDict({"conv": torch.nn.Conv2d(3, 6, 3, **kw), "bn": torch.nn.BatchNorm2d(6)})
        with torch.no_grad():
            self.m["bn"].weight.uniform_(0.5, 1.5)
            self.m["bn"].bias.uniform_(-0.5, 0.5)
        self.relu = relu

    def __call__(self, x):
        y = self.m["bn"](self.m["conv"](x))
        return self.torch.relu(y) if self.relu else y

    def named_parameters(self):
        return self.m.named_parameters()


@pytest.mark.parametrize("relu", [False, True], ids=["ConvBn2d", "ConvBnRelu2d"])
def test_conv_bn_modules_match_torch_in_training_and_eval(torch, rng, relu):
    ours = (M.ConvBnRelu2d if relu else M.ConvBn2d)(3, 6, 3, padding=1, stride=2)
    theirs = _TorchConvBn(torch, relu, padding=1, stride=2)
    assert sorted(ours.state_dict()) == ["bn.bias", "bn.running_mean", "bn.running_var", "bn.weight",
                                         "conv.bias", "conv.weight"]
    _copy_params(ours, theirs)
    x = rng.normal(size=(4, 3, 7, 7)).astype("float32")
    dy = rng.normal(size=(4, 6, 4, 4)).astype("float32")
    # (in training, batch norm removes each channel's mean: the conv bias's
    # gradient is 0 up to float32 rounding, ~1e-5 either way)
    _assert_same(_run(ours, x, dy), _run_torch(torch, theirs, x, dy), atol=1e-4)
    # MegEngine's momentum 0.9 is torch's 0.1: the same running statistics
    np.testing.assert_allclose(ours.bn.running_mean.numpy().reshape(-1), theirs.m["bn"].running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
    ours.eval()
    theirs.m.eval()
    _assert_same(_run(ours, x, dy), _run_torch(torch, theirs, x, dy))


def test_conv_transpose3d_matches_torch(torch, rng):
    ours = M.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1)
    theirs = torch.nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1)
    assert ours.weight.shape == (4, 6, 3, 3, 3) and ours.bias.shape == (1, 6, 1, 1, 1)
    _copy_params(ours, theirs)
    x = rng.normal(size=(2, 4, 3, 4, 3)).astype("float32")
    dy = rng.normal(size=(2, 6, 6, 8, 6)).astype("float32")
    _assert_same(_run(ours, x, dy), _run_torch(torch, theirs, x, dy))
    with pytest.raises(ValueError, match="ConvTranspose3d: output_padding"):
        M.ConvTranspose3d(4, 6, 3, stride=1, output_padding=1)


@pytest.mark.parametrize("mode, np_mode", [("constant", "constant"), ("reflect", "reflect"),
                                           ("replicate", "edge")])
def test_pad_module_follows_megengine(mode, np_mode):
    x = np.arange(6, dtype="float32").reshape(2, 3)
    kw = {"constant_val": 9.0} if mode == "constant" else {}
    y = M.Pad(((1, 1), (1, 2)), mode=mode, **kw)(gc.tensor(x)).numpy()
    want = np.pad(x, ((1, 1), (1, 2)), mode=np_mode, **({"constant_values": 9.0} if mode == "constant" else {}))
    np.testing.assert_array_equal(y, want)


def test_pixel_shuffle_module_matches_torch(torch, rng):
    x = rng.normal(size=(2, 18, 4, 3)).astype("float32")
    dy = rng.normal(size=(2, 2, 12, 9)).astype("float32")
    _assert_same(_run(M.PixelShuffle(3), x, dy), _run_torch(torch, torch.nn.PixelShuffle(3), x, dy))
